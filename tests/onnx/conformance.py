"""The ONNX package's own bundled model tests, run the way its backend test runner
runs them (onnx/backend/test/runner and loader): the same inputs, the same
comparison, the same tolerances.

`light` models ship expected outputs but no inputs: the runner feeds each
float input `arange(n).reshape(shape) / n` (dimensions without a size taken as
1) and takes rtol/atol from `data/real/<model>/data.json`. Other folders hold
`test_data_set_*/input_*.pb` and `output_*.pb`, with rtol 1e-3 and atol 1e-7
unless the folder has a `data.json`.

`python -m tests.onnx.conformance` prints one line per model and the pass count.
"""

from __future__ import annotations

import glob
import json
import os
import sys
import time
from dataclasses import dataclass

import numpy as np

FOLDERS = ("light", "pytorch-converted", "pytorch-operator", "simple")


@dataclass
class Case:
    name: str  # "<folder>/<test name>"
    model_path: str
    data_dirs: list[str]  # test_data_set_* folders (empty for light models)
    expected_outputs: list[str]  # light models: their expected output files
    rtol: float
    atol: float


def data_dir() -> str:
    import onnx

    return os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")


def cases() -> list[Case]:
    root = data_dir()
    found = []
    for folder in FOLDERS[1:]:
        for case_dir in sorted(glob.glob(os.path.join(root, folder, "*"))):
            model = os.path.join(case_dir, "model.onnx")
            if not os.path.isfile(model):
                continue
            rtol, atol = 1e-3, 1e-7  # the loader's defaults
            meta = os.path.join(case_dir, "data.json")
            if os.path.exists(meta):
                with open(meta) as f:
                    data = json.load(f)
                rtol, atol = data.get("rtol", rtol), data.get("atol", atol)
            found.append(Case(f"{folder}/{os.path.basename(case_dir)}", model,
                              sorted(glob.glob(os.path.join(case_dir, "test_data_set*"))), [],
                              rtol, atol))
    for meta in sorted(glob.glob(os.path.join(root, "real", "*", "data.json"))):
        with open(meta) as f:
            data = json.load(f)
        url = data.get("url", "")
        if not url.startswith("onnx/backend/test/data/light/"):
            continue
        model = os.path.join(root, "light", os.path.basename(url))
        prefix = os.path.splitext(model)[0]
        outputs = sorted(glob.glob(f"{prefix}_output_*.pb"))
        found.append(Case(f"light/{data['model_name']}", model, [], outputs,
                          data.get("rtol", 1e-3), data.get("atol", 1e-7)))
    return sorted(found, key=lambda c: c.name)


def _load_proto(path: str, type_proto: object) -> object:
    """As the runner's _load_proto: a tensor, or a list for a sequence."""
    import onnx
    from onnx import numpy_helper

    with open(path, "rb") as f:
        content = f.read()
    if type_proto.HasField("sequence_type"):
        seq = onnx.SequenceProto()
        seq.ParseFromString(content)
        return numpy_helper.to_list(seq)
    tensor = onnx.TensorProto()
    tensor.ParseFromString(content)
    return numpy_helper.to_array(tensor)


def dummy_input(value_info: object) -> np.ndarray:
    """The runner's generate_dummy_data(random=False): arange / n as float32."""
    shape = tuple(d.dim_value if d.HasField("dim_value") else 1
                  for d in value_info.type.tensor_type.shape.dim)
    n = np.prod(shape)
    return (np.arange(n).reshape(shape) / n).astype(np.float32)


def data_sets(case: Case) -> list[tuple[list, list]]:
    """(inputs, expected outputs) per data set, loaded as the runner loads them."""
    import onnx

    model = onnx.load(case.model_path, load_external_data=False)
    graph = model.graph
    if not case.data_dirs:
        inits = {i.name for i in graph.initializer}
        inputs = [dummy_input(i) for i in graph.input if i.name not in inits]
        outputs = [_load_proto(p, graph.output[i].type)
                   for i, p in enumerate(case.expected_outputs)]
        return [(inputs, outputs)]
    sets = []
    for d in case.data_dirs:
        n_in = len(glob.glob(os.path.join(d, "input_*.pb")))
        n_out = len(glob.glob(os.path.join(d, "output_*.pb")))
        inputs = [_load_proto(os.path.join(d, f"input_{i}.pb"), graph.input[i].type)
                  for i in range(n_in)]
        outputs = [_load_proto(os.path.join(d, f"output_{i}.pb"), graph.output[i].type)
                   for i in range(n_out)]
        sets.append((inputs, outputs))
    return sets


def assert_similar(expected: list, actual: tuple, rtol: float, atol: float) -> None:
    """The runner's assert_similar_outputs: lengths, shapes, dtypes, then allclose."""
    assert len(actual) == len(expected), f"{len(actual)} outputs, expected {len(expected)}"
    for i, (ref, out) in enumerate(zip(expected, actual)):
        if isinstance(ref, list):
            assert isinstance(out, list), f"output {i}: expected a sequence"
            assert_similar(ref, tuple(out), rtol, atol)
            continue
        out = np.asarray(out)
        np.testing.assert_array_equal(out.shape, ref.shape, err_msg=f"output {i} has the wrong "
                                                                    "shape")
        if ref.dtype == object:
            np.testing.assert_array_equal(out, ref)
        else:
            np.testing.assert_equal(out.dtype, ref.dtype)
            np.testing.assert_allclose(out, ref, rtol=rtol, atol=atol)


def run_case(case: Case) -> None:
    import pullback.onnx

    model = pullback.onnx.load(case.model_path)
    for inputs, expected in data_sets(case):
        # The first call traces the plan (its result is the trace's); the second runs it.
        for _ in range(2):
            with np.errstate(invalid="ignore"):  # sqrt and pow of negatives are NaN, as expected
                actual = model(*inputs)
            assert_similar(expected, actual, case.rtol, case.atol)


def main() -> int:
    import pullback.onnx

    passed, unsupported, failed = 0, [], []
    all_cases = cases()
    for case in all_cases:
        start = time.perf_counter()
        try:
            run_case(case)
            passed += 1
            status = "pass"
        except pullback.onnx.UnsupportedOperatorError as err:
            unsupported.append(case.name)
            status = "unsupported: " + "; ".join(f"{op}: {why}" for op, why in err.unsupported)
        except Exception as err:  # report and go on: this is a survey
            failed.append(case.name)
            status = f"FAIL {type(err).__name__}: {str(err).splitlines()[0][:200]}"
        print(f"{case.name:60s} {time.perf_counter() - start:6.2f}s  {status}")
    print(f"ONNX conformance: {passed} of {len(all_cases)} pass, {len(unsupported)} unsupported, "
          f"{len(failed)} fail")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Reading and validating an ONNX file into a `GraphSpec` the model runs.

Checks come in the order that gives the most useful error: a file that does
not parse, external data that cannot be read safely (outside the model's
folder, a symlink, a device, a size other than the tensor's), an opset newer
than pullback implements, then operators pullback does not implement (all
listed at once), then the ONNX checker, tensor sizes against the memory budget,
and strict shape inference, which catches shapes that contradict each other.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import BadModelError, OnnxImportError, UnsupportedOperatorError
from .registry import CONVERTERS, DEFAULT_DOMAIN, UNSUPPORTED, Converter, highest_opset


def import_onnx() -> Any:
    """The `onnx` package, or an ImportError saying how to install it."""
    try:
        import onnx
    except ImportError:
        raise ImportError("pullback.onnx needs the onnx package: "
                          "pip install 'pullback[onnx]'") from None
    return onnx


def default_max_tensor_bytes() -> int:
    """Half the machine's memory: no single tensor a model declares may need more."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
    except (ValueError, OSError, AttributeError):
        return 8 << 30


@dataclass
class ValueSpec:
    """A graph input or output as declared: `kind` is "tensor", "sequence" or "other"."""

    name: str
    kind: str
    dtype: np.dtype | None  # None where undeclared (or a sequence's element type)
    shape: tuple | None  # ints, names of symbolic dimensions, or None for unknown ones


@dataclass
class NodeSpec:
    proto: Any
    index: int
    since: int
    attrs: dict[str, Any]
    converter: Converter


@dataclass
class GraphSpec:
    inputs: list[ValueSpec]  # those the caller must pass (inputs without an initializer)
    outputs: list[ValueSpec]
    initializers: dict[str, np.ndarray]
    nodes: list[NodeSpec]
    opsets: dict[str, int]
    # Why this graph must run eagerly rather than as a plan, if it must.
    eager_reason: str | None = None
    name: str = ""


def read_model(source: Any, max_tensor_bytes: int) -> Any:
    """A ModelProto from a path, bytes, or a ModelProto; a path's external data is read
    in (tensors over `max_tensor_bytes` refused before reading)."""
    onnx = import_onnx()
    if isinstance(source, onnx.ModelProto):
        return source
    if isinstance(source, (bytes, bytearray, memoryview)):
        data, where = bytes(source), "the bytes given"
    elif isinstance(source, (str, os.PathLike)):
        where = os.fspath(source)
        if not os.path.isfile(where):
            raise FileNotFoundError(f"onnx.load: no such file: {where!r}")
        with open(where, "rb") as f:
            data = f.read()
    else:
        raise TypeError(f"pullback.onnx.load: expected a path, bytes or a ModelProto, not "
                        f"{type(source).__name__}")
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception as err:  # protobuf raises DecodeError, or RuntimeError on some builds
        raise BadModelError(f"{where} is not a valid ONNX model ({len(data):,} bytes; it may be "
                            f"truncated or corrupted): {err}") from None
    if not model.HasField("graph") or not model.opset_import:
        raise BadModelError(f"{where} is not a complete ONNX model ({len(data):,} bytes): it "
                            f"has {'no graph' if not model.HasField('graph') else 'no opsets'}; "
                            "the file may be truncated")
    if isinstance(source, (str, os.PathLike)):
        folder = os.path.dirname(os.path.abspath(where))
        for tensor, what in _stored_tensors(model.graph):
            if tensor.data_location == _EXTERNAL:
                _read_external_data(tensor, folder, max_tensor_bytes, what)
    return model


_EXTERNAL = 1  # TensorProto.EXTERNAL: the data lives in a file beside the model


def _stored_tensors(graph: Any) -> list[tuple[Any, str]]:
    """Every tensor the graph stores, with what to call it in an error: initializers,
    and node attributes (a Constant's value), subgraphs included."""
    from onnx import AttributeProto

    found = [(t, f"initializer {t.name!r}") for t in graph.initializer]
    for index, node in enumerate(graph.node):
        where = f"{node.op_type} node {node.name or '#' + str(index)!r}"
        for a in node.attribute:
            if a.type == AttributeProto.TENSOR:
                found.append((a.t, f"{where}: attribute {a.name!r}"))
            elif a.type == AttributeProto.TENSORS:
                found.extend((t, f"{where}: attribute {a.name!r}") for t in a.tensors)
            elif a.type == AttributeProto.GRAPH:
                found.extend(_stored_tensors(a.g))
            elif a.type == AttributeProto.GRAPHS:
                for g in a.graphs:
                    found.extend(_stored_tensors(g))
    return found


def _read_external_data(tensor: Any, folder: str, max_bytes: int, what: str) -> None:
    """Read a tensor's external data into it, after checking its declared size against
    the budget and the file's size against the declared one (so that no more than the
    tensor is ever read). onnx refuses locations outside the model's folder, symlinks
    and anything but a regular file; those refusals name the tensor and the path."""
    from onnx.external_data_helper import load_external_data_for_tensor

    dims, dtype, nbytes = _declared_size(tensor, max_bytes, what)
    info = {e.key: e.value for e in tensor.external_data}
    location = info.get("location", "")
    path = os.path.normpath(os.path.join(folder, location))
    found = None
    # Only a plain file inside the folder is measured; anything else is onnx's to refuse.
    if not os.path.isabs(location) and os.path.commonpath([folder, path]) == folder:
        try:
            offset, length = int(info.get("offset", 0)), info.get("length")
            length = None if length is None else int(length)
            found = os.lstat(path)
        except (ValueError, OSError):
            pass  # a bad offset or length, or no such file: onnx's refusal says which
    if found is not None and stat.S_ISREG(found.st_mode) and dtype.kind != "O":
        available = max(found.st_size - offset, 0) if length is None else length
        if available != nbytes:
            raise BadModelError(f"{what}: shape {dims} {dtype} needs {nbytes:,} bytes of data, "
                                f"but its external data {location!r} (in {folder}) holds "
                                f"{available:,}")
    try:
        load_external_data_for_tensor(tensor, folder)
    except Exception as err:  # onnx's ValidationError, ValueError or OSError
        raise BadModelError(f"{what}: cannot read its external data {location!r} (in "
                            f"{folder}): {err}") from None


def _declared_size(proto: Any, max_bytes: int, what: str) -> tuple[tuple, np.dtype, int]:
    """A TensorProto's shape, dtype and size in bytes, refused when over `max_bytes`."""
    from onnx import helper

    try:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(proto.data_type))
    except (KeyError, TypeError, ValueError):
        raise BadModelError(f"{what}: unknown or unsupported element type "
                            f"{proto.data_type}") from None
    dims = tuple(int(d) for d in proto.dims)
    if any(d < 0 for d in dims):
        raise BadModelError(f"{what}: negative dimension in shape {dims}")
    count = 1
    for d in dims:
        count *= d
    nbytes = count * dtype.itemsize
    if nbytes > max_bytes:
        raise OnnxImportError(f"{what}: shape {dims} {dtype} declares {nbytes:,} bytes, over "
                              f"the limit of {max_bytes:,} (load(..., max_tensor_bytes=...) "
                              "raises it)")
    return dims, dtype, nbytes


def tensor_to_array(proto: Any, max_bytes: int, what: str) -> np.ndarray:
    """A TensorProto as a NumPy array, refusing one that would exceed `max_bytes` or
    whose data does not match its declared shape, before allocating anything."""
    from onnx import numpy_helper

    dims, dtype, nbytes = _declared_size(proto, max_bytes, what)
    if proto.data_location == _EXTERNAL:
        raise BadModelError(f"{what}: its data lives in an external file; load the model from "
                            "its path (next to that file), not from bytes")
    if proto.HasField("raw_data") and dtype.kind != "O" and len(proto.raw_data) != nbytes:
        raise BadModelError(f"{what}: shape {dims} {dtype} needs {nbytes:,} bytes of data, but "
                            f"the file holds {len(proto.raw_data):,}")
    try:
        array = numpy_helper.to_array(proto)
    except Exception as err:
        raise BadModelError(f"{what}: its data does not match shape {dims} {dtype}: "
                            f"{err}") from None
    # (np.ascontiguousarray would turn a 0-d scalar into shape (1,).)
    return array if array.flags.c_contiguous else np.ascontiguousarray(array)


def _value_spec(info: Any) -> ValueSpec:
    from onnx import helper

    kind = info.type.WhichOneof("value")
    if kind == "tensor_type":
        tt = info.type.tensor_type
        dtype = None
        if tt.elem_type:
            try:
                dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type))
            except (KeyError, TypeError, ValueError):
                dtype = None
        shape = None
        if tt.HasField("shape"):
            shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                          for d in tt.shape.dim)
        return ValueSpec(info.name, "tensor", dtype, shape)
    if kind == "sequence_type":
        return ValueSpec(info.name, "sequence", None, None)
    return ValueSpec(info.name, "other", None, None)


def _attributes(node: Any, max_bytes: int, where: str) -> dict[str, Any]:
    from onnx import AttributeProto, helper

    attrs: dict[str, Any] = {}
    for a in node.attribute:
        if a.type == AttributeProto.TENSOR:
            attrs[a.name] = tensor_to_array(a.t, max_bytes, f"{where}: attribute {a.name!r}")
            continue
        value = helper.get_attribute_value(a)
        if isinstance(value, bytes):
            value = value.decode("utf-8")
        elif isinstance(value, list) and value and isinstance(value[0], bytes):
            value = [v.decode("utf-8") for v in value]
        attrs[a.name] = value
    return attrs


def _schema_since(op_type: str, domain: str, opset: int) -> int | None:
    from onnx import defs

    try:
        return defs.get_schema(op_type, opset, domain).since_version
    except Exception:  # SchemaError: not an operator of this domain at this opset
        return None


def _node_label(op_type: str, domain: str, opset: int | None) -> str:
    prefix = f"{domain}." if domain else ""
    return f"{prefix}{op_type} (opset {opset})" if opset is not None else f"{prefix}{op_type}"


def _check_operators(model: Any, opsets: dict[str, int]) -> list[tuple]:
    """(node proto, since, converter) per node, or UnsupportedOperatorError listing
    every unsupported operator, version and attribute at once."""
    problems: dict[tuple[str, str], None] = {}
    resolved = []
    for node in model.graph.node:
        domain = DEFAULT_DOMAIN if node.domain in ("", "ai.onnx") else node.domain
        opset = opsets.get(domain)
        label = _node_label(node.op_type, domain, opset)
        if opset is None:
            problems[(label, f"the model imports no opset for domain {domain!r}")] = None
            continue
        conv = CONVERTERS.get((domain, node.op_type))
        since = _schema_since(node.op_type, domain, opset)
        if conv is None:
            reason = UNSUPPORTED.get((domain, node.op_type))
            if reason is None:
                reason = ("not an ONNX operator at this opset" if since is None
                          else "not implemented by pullback")
            problems[(label, reason)] = None
            continue
        if since is None or since not in conv.versions:
            versions = ", ".join(str(v) for v in sorted(conv.versions))
            problems[(label, f"its schema version {since} is not implemented (implemented: "
                             f"{versions})")] = None
            continue
        unknown = sorted({a.name for a in node.attribute} - conv.attrs)
        if unknown:
            problems[(label, f"attribute{'s' if len(unknown) > 1 else ''} "
                             f"{', '.join(unknown)} not implemented")] = None
            continue
        resolved.append((node, since, conv))
    if problems:
        raise UnsupportedOperatorError(list(problems))
    return resolved


def parse(model: Any, max_tensor_bytes: int) -> GraphSpec:
    """Validate a ModelProto and turn it into a GraphSpec."""
    onnx = import_onnx()
    opsets: dict[str, int] = {}
    for imp in model.opset_import:
        domain = DEFAULT_DOMAIN if imp.domain in ("", "ai.onnx") else imp.domain
        opsets[domain] = int(imp.version)
    newest = highest_opset()
    if opsets.get(DEFAULT_DOMAIN, 0) > newest:
        raise OnnxImportError(f"the model imports ONNX opset {opsets[DEFAULT_DOMAIN]}, newer "
                              f"than opset {newest}, the newest pullback implements; export it "
                              f"with opset {newest} or older")
    resolved = _check_operators(model, opsets)
    try:
        onnx.checker.check_model(model)
    except Exception as err:  # ValidationError
        raise BadModelError(f"the model fails the ONNX checker: {err}") from None
    graph = model.graph
    initializers = {}
    for t in graph.initializer:
        initializers[t.name] = tensor_to_array(t, max_tensor_bytes, f"initializer {t.name!r}")
    try:
        onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    except Exception as err:  # InferenceError
        raise BadModelError(f"the model's shapes or types are inconsistent: {err}") from None
    nodes = []
    for index, (node, since, conv) in enumerate(resolved):
        where = f"{node.op_type} node {node.name or '#' + str(index)!r}"
        nodes.append(NodeSpec(node, index, since, _attributes(node, max_tensor_bytes, where),
                              conv))
    inputs = [_value_spec(i) for i in graph.input if i.name not in initializers]
    outputs = [_value_spec(o) for o in graph.output]
    eager = next((f"{n.proto.op_type}: {n.converter.eager_only}" for n in nodes
                  if n.converter.eager_only), None)
    if eager is None and any(i.kind != "tensor" or (i.dtype is not None and i.dtype.kind == "O")
                             for i in inputs):
        eager = "an input is a sequence or a string tensor"
    return GraphSpec(inputs, outputs, initializers, nodes, opsets, eager, graph.name)

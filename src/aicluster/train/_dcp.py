"""torch.distributed.checkpoint, made safe to load: nothing in a checkpoint can run code.

DCP stores tensors safely but has two pickles: its ``.metadata`` file (read with ``pickle.load``)
and non-tensor values (read with ``torch.load(weights_only=False)``). Here the metadata is read
by an unpickler that admits only DCP's own metadata classes, torch dtypes and sizes; non-tensor
values are loaded with ``weights_only=True`` (plain containers, numbers, strings); and an
``io.BytesIO`` value is written and read back as raw bytes (the library stores JSON that way),
where DCP would pickle it.
"""

from __future__ import annotations

import io
import pickle
from typing import IO, Any

import torch
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem, WriteItem, WriteItemType

__all__ = ["RawBytesSavePlanner", "SafeLoadPlanner", "SafeReader", "safe_unpickle"]

_METADATA_NAMES = frozenset(
    {
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "Metadata",
        "MetadataIndex",
        "StorageMeta",
        "TensorProperties",
        "TensorStorageMetadata",
        "_MEM_FORMAT_ENCODING",
    }
)
_ALLOWED: dict[str, frozenset[str]] = {
    "torch.distributed.checkpoint.metadata": _METADATA_NAMES,
    "torch.distributed.checkpoint.filesystem": frozenset({"_StorageInfo"}),
    "torch.serialization": frozenset({"_get_layout"}),
    "pathlib": frozenset({"Path", "PosixPath", "WindowsPath", "PurePosixPath"}),
    "collections": frozenset({"OrderedDict"}),
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        value = getattr(torch, name, None) if module == "torch" else None
        if name == "Size" or isinstance(value, torch.dtype):
            return value
        if name in _ALLOWED.get(module, ()):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing {module}.{name} in checkpoint metadata")


def safe_unpickle(data: IO[bytes] | io.IOBase) -> Any:
    """Unpickle DCP metadata, refusing every global but DCP's metadata types."""
    return _MetadataUnpickler(data).load()


class SafeReader(FileSystemReader):
    """A ``FileSystemReader`` whose metadata is read by :func:`safe_unpickle`."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as stream:
            metadata = safe_unpickle(stream)
        if not isinstance(metadata, Metadata):
            raise pickle.UnpicklingError("checkpoint metadata is not DCP Metadata")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        assert metadata.storage_meta is not None
        metadata.storage_meta.load_id = self.load_id
        return metadata


class RawBytesSavePlanner(DefaultSavePlanner):
    """Writes ``io.BytesIO`` values as their bytes (DCP would ``torch.save`` them)."""

    def transform_object(self, write_item: WriteItem, object: Any) -> Any:
        if write_item.type == WriteItemType.BYTE_IO and isinstance(object, io.BytesIO):
            return object
        return super().transform_object(write_item, object)


class SafeLoadPlanner(DefaultLoadPlanner):
    """Reads into ``io.BytesIO`` templates raw, and everything else with ``weights_only=True``."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        fqn = read_item.dest_index.fqn
        template = self.state_dict.get(fqn)
        if isinstance(template, io.BytesIO):
            template.seek(0)
            template.truncate()
            template.write(value.getbuffer())
            return
        loaded = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], loaded)
        else:
            self.state_dict[fqn] = loaded

"""The fsspec file system of dafne: ``fsspec.filesystem("dafne", cluster=DIR)``.

Every call goes to the cluster through the native client (``dafne.Client``)
of this process: no mount, no FUSE, no kernel in the data path. Paths are
absolute within the file system; ``dafne:///a/b``, ``dafne://a/b`` and
``/a/b`` name the same file.

Why it is built this way:

* Files are ``fsspec.spec.AbstractBufferedFile`` s over a native file that is
  opened when the Python file is, so a missing file or parent directory, or
  an existing one for ``xb``, fails at ``open`` as with a local file. Reads
  go through fsspec's read-ahead cache in blocks (``block_size``, default
  8 MiB) fetched with ``pread``; writes are buffered into blocks and written
  in order; ``close`` publishes the size (the client library's size rule:
  another open sees the bytes once the writer closed).
* Whole-file operations (``cat_file``, ``pipe_file``, ``put_file``,
  ``get_file``, ``cp_file``) use the native file directly in 8 MiB pieces,
  without fsspec's buffering; ``mv`` of one path is one atomic rename on the
  metadata server (a directory moves with everything in it).
* Errors are the ``OSError`` subclasses a local file system raises
  (``FileNotFoundError``, ``FileExistsError``, ``NotADirectoryError``...).
* ``auto_mkdir=True`` makes parents on write, like fsspec's local file
  system's option of that name; by default a missing parent is an error.
"""

import datetime
import os

from fsspec.callbacks import DEFAULT_CALLBACK
from fsspec.spec import AbstractBufferedFile, AbstractFileSystem
from fsspec.utils import stringify_path

from ._native import Client

__all__ = ["DafneFileSystem", "DafneFile"]

# Bytes moved per native call by the whole-file operations.
PIECE = 8 << 20


def _type(st):
    """fsspec's entry type: a symbolic link is "other" (it is not followed)."""
    return st.type if st.type in ("file", "directory") else "other"


class DafneFileSystem(AbstractFileSystem):
    """dafne as an fsspec file system.

    Parameters
    ----------
    cluster: str or None
        A cluster directory (``dafne up --dir``) or its ``cluster.json``;
        default ``$DAFNE_HOME``, else ``~/.dafne``.
    credential: str or None
        A per-client credential file (``dafne credential issue``) to log in
        with instead of the cluster secret.
    auto_mkdir: bool
        Make missing parent directories when writing a file.
    """

    protocol = "dafne"
    root_marker = "/"

    def __init__(self, cluster=None, credential=None, auto_mkdir=False, name="fsspec", **kwargs):
        super().__init__(cluster=cluster, credential=credential, auto_mkdir=auto_mkdir, name=name, **kwargs)
        self.client = Client(
            cluster=None if cluster is None else os.fspath(cluster),
            credential=None if credential is None else os.fspath(credential),
            name=name,
        )
        self.auto_mkdir = auto_mkdir

    # -- paths ------------------------------------------------------------

    @classmethod
    def _strip_protocol(cls, path):
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        path = stringify_path(path)
        for prefix in ("dafne://", "dafne:"):
            if path.startswith(prefix):
                path = path[len(prefix) :]
                break
        parts = [p for p in path.split("/") if p and p != "."]
        return "/" + "/".join(parts)

    @staticmethod
    def _get_kwargs_from_urls(path):
        return {}

    @staticmethod
    def _join(parent, name):
        return parent.rstrip("/") + "/" + name

    # -- listing and attributes ---------------------------------------------

    @staticmethod
    def _info(path, st):
        return {
            "name": path,
            "size": st.st_size,
            "type": _type(st),
            "islink": st.type == "symlink",
            "mode": st.st_mode,
            "uid": st.st_uid,
            "gid": st.st_gid,
            "ino": st.st_ino,
            "nlink": st.st_nlink,
            "mtime": st.st_mtime,
            "created": st.st_ctime,
        }

    def info(self, path, **kwargs):
        path = self._strip_protocol(path)
        return self._info(path, self.client.stat(path))

    def ls(self, path, detail=True, **kwargs):
        path = self._strip_protocol(path)
        try:
            entries = self.client.scandir(path)
        except NotADirectoryError:
            info = self.info(path)
            return [info] if detail else [info["name"]]
        infos = sorted((self._info(self._join(path, n), st) for n, st in entries), key=lambda i: i["name"])
        return infos if detail else [i["name"] for i in infos]

    def exists(self, path, **kwargs):
        return self.client.exists(self._strip_protocol(path))

    def created(self, path):
        return datetime.datetime.fromtimestamp(self.info(path)["created"], tz=datetime.timezone.utc)

    def modified(self, path):
        return datetime.datetime.fromtimestamp(self.info(path)["mtime"], tz=datetime.timezone.utc)

    # -- directories ------------------------------------------------------

    def mkdir(self, path, create_parents=True, **kwargs):
        path = self._strip_protocol(path)
        if create_parents:
            if self.exists(path):
                raise FileExistsError(path)
            self.makedirs(path, exist_ok=True)
        else:
            self.client.mkdir(path, kwargs.get("mode", 0o755))

    def makedirs(self, path, exist_ok=False):
        path = self._strip_protocol(path)
        if path == "/":
            if not exist_ok:
                raise FileExistsError(path)
            return
        parts = path.strip("/").split("/")
        cur = ""
        for i, part in enumerate(parts):
            cur += "/" + part
            try:
                self.client.mkdir(cur)
            except FileExistsError:
                last = i == len(parts) - 1
                if (last and not exist_ok) or self.client.stat(cur).type != "directory":
                    raise

    def rmdir(self, path):
        self.client.rmdir(self._strip_protocol(path))

    # -- removing and moving -----------------------------------------------

    def rm_file(self, path):
        self.client.unlink(self._strip_protocol(path))

    _rm = rm_file

    def rm(self, path, recursive=False, maxdepth=None):
        """Remove files and, with ``recursive``, directories with all they hold
        (an empty directory goes without it)."""
        paths = self.expand_path(path, recursive=recursive, maxdepth=maxdepth)
        # expand_path sorts: a directory comes before what it holds.
        for p in reversed(paths):
            if self.client.stat(p).type == "directory":
                self.client.rmdir(p)
            else:
                self.client.unlink(p)

    def mv(self, path1, path2, recursive=False, maxdepth=None, **kwargs):
        """One path: an atomic rename (into ``path2`` when it is an existing
        directory). Lists and globs: fsspec's copy and remove."""
        if isinstance(path1, list) or isinstance(path2, list) or any(c in str(path1) for c in "*?["):
            return super().mv(path1, path2, recursive=recursive, maxdepth=maxdepth, **kwargs)
        p1, p2 = self._strip_protocol(path1), self._strip_protocol(path2)
        if p1 == p2:
            return
        if self.auto_mkdir:
            self.makedirs(self._parent(p2), exist_ok=True)
        try:
            if self.client.stat(p2).type == "directory" and self.client.stat(p1).type != "directory":
                p2 = self._join(p2, p1.rsplit("/", 1)[-1])
        except FileNotFoundError:
            pass
        self.client.rename(p1, p2)

    # -- whole files --------------------------------------------------------

    def _parent_for_write(self, path):
        if self.auto_mkdir:
            self.makedirs(self._parent(path), exist_ok=True)

    def cat_file(self, path, start=None, end=None, **kwargs):
        path = self._strip_protocol(path)
        with self.client.open(path, "rb") as f:
            size = f.size
            start = 0 if start is None else (max(0, size + start) if start < 0 else min(start, size))
            end = size if end is None else (max(0, size + end) if end < 0 else min(end, size))
            if end <= start:
                return b""
            return f.pread(end - start, start)

    def pipe_file(self, path, value, mode="overwrite", **kwargs):
        path = self._strip_protocol(path)
        self._parent_for_write(path)
        with self.client.open(path, "xb" if mode == "create" else "wb") as f:
            f.write(value)

    def cp_file(self, path1, path2, **kwargs):
        p1, p2 = self._strip_protocol(path1), self._strip_protocol(path2)
        if self.client.stat(p1).type == "directory":
            self.makedirs(p2, exist_ok=True)
            return
        self._parent_for_write(p2)
        with self.client.open(p1, "rb") as src, self.client.open(p2, "wb") as dst:
            while True:
                data = src.read(PIECE)
                if not data:
                    break
                dst.write(data)

    def put_file(self, lpath, rpath, callback=DEFAULT_CALLBACK, mode="overwrite", **kwargs):
        rpath = self._strip_protocol(rpath)
        if os.path.isdir(lpath):
            self.makedirs(rpath, exist_ok=True)
            return
        self.makedirs(self._parent(rpath), exist_ok=True)
        with open(lpath, "rb") as src, self.client.open(rpath, "xb" if mode == "create" else "wb") as dst:
            callback.set_size(os.fstat(src.fileno()).st_size)
            while True:
                data = src.read(PIECE)
                if not data:
                    break
                dst.write(data)
                callback.relative_update(len(data))

    def get_file(self, rpath, lpath, callback=DEFAULT_CALLBACK, outfile=None, **kwargs):
        rpath = self._strip_protocol(rpath)
        if outfile is None and not isinstance(lpath, (str, os.PathLike)):
            outfile = lpath
        if outfile is None and self.isdir(rpath):
            os.makedirs(lpath, exist_ok=True)
            return
        if outfile is None:
            parent = os.path.dirname(os.fspath(lpath))
            if parent:
                os.makedirs(parent, exist_ok=True)
        with self.client.open(rpath, "rb") as src:
            callback.set_size(src.size)
            out = open(lpath, "wb") if outfile is None else outfile
            try:
                while True:
                    data = src.read(PIECE)
                    if not data:
                        break
                    out.write(data)
                    callback.relative_update(len(data))
            finally:
                if outfile is None:
                    out.close()

    def touch(self, path, truncate=True, **kwargs):
        path = self._strip_protocol(path)
        self._parent_for_write(path)
        if truncate or not self.exists(path):
            self.client.open(path, "wb").close()
        else:
            self.client.utime(path)

    # -- files ----------------------------------------------------------------

    def _open(self, path, mode="rb", block_size=None, autocommit=True, cache_options=None, **kwargs):
        path = self._strip_protocol(path)
        if mode != "rb":
            self._parent_for_write(path)
        return DafneFile(self, path, mode, block_size, autocommit, cache_options=cache_options, **kwargs)


class DafneFile(AbstractBufferedFile):
    """A buffered fsspec file over a native ``dafne.File`` (module docs)."""

    DEFAULT_BLOCK_SIZE = 8 << 20

    def __init__(self, fs, path, mode="rb", block_size="default", autocommit=True, cache_options=None, **kwargs):
        if not autocommit:
            raise NotImplementedError("dafne writes files in place: autocommit=False (transactions) is not supported")
        if mode not in ("rb", "wb", "xb", "ab"):
            raise NotImplementedError("file mode %r not supported: use rb, wb, xb or ab" % (mode,))
        self._native = fs.client.open(path, mode)
        try:
            super().__init__(
                fs,
                path,
                mode,
                block_size,
                autocommit,
                cache_options=cache_options,
                size=self._native.size if mode == "rb" else None,
                **kwargs,
            )
        except BaseException:
            self._native.close()
            raise
        if mode == "ab":
            self.loc = self._native.size

    def _fetch_range(self, start, end):
        return self._native.pread(end - start, start)

    def _upload_chunk(self, final=False):
        data = self.buffer.getvalue()
        if data:
            # Writes come in order; the native position follows them (and
            # in append mode starts at the end).
            self._native.write(data)
        return True

    def close(self):
        if self.closed:
            return
        try:
            super().close()
        finally:
            self._native.close()

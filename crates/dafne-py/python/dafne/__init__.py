"""dafne from Python, without a mount.

``dafne.Client`` is the client library in this process (the native API:
``stat``, ``listdir``, ``scandir``, ``mkdir``, ``rmdir``, ``unlink``,
``rename``, ``truncate``, ``utime``, ``open``); ``dafne.fs.DafneFileSystem``
is the fsspec file system on top of it, registered as the ``dafne``
protocol, so pandas and pyarrow read and write ``dafne:///path`` URLs with
``storage_options={"cluster": DIR}``. See docs/PYTHON.md.
"""

from ._native import Client, File, Stat

__all__ = ["Client", "File", "Stat"]

try:
    import fsspec
except ImportError:  # the native API works without fsspec
    pass
else:
    # The wheel's entry point ("fsspec.specs") registers the protocol too;
    # this covers a package imported from a source tree.
    fsspec.register_implementation("dafne", "dafne.fs.DafneFileSystem", clobber=True)

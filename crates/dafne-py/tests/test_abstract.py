"""fsspec's own abstract file-system tests (fsspec.tests.abstract: copy,
get, put, open, pipe) run against dafne."""

import uuid

import pytest

abstract = pytest.importorskip("fsspec.tests.abstract")

from dafne.fs import DafneFileSystem  # noqa: E402


class DafneFixtures(abstract.AbstractFixtures):
    @pytest.fixture(scope="class")
    @classmethod
    def fs(cls, cluster):
        # Parents are made on write, as fsspec's local file system in its
        # own run of these tests (LocalFileSystem(auto_mkdir=True)).
        return DafneFileSystem(cluster=cluster, auto_mkdir=True)

    @pytest.fixture
    def fs_join(self):
        return lambda *args: "/".join(args)

    @pytest.fixture
    def fs_path(self, fs):
        path = "/abstract-" + uuid.uuid4().hex[:12]
        fs.mkdir(path)
        yield path
        fs.rm(path, recursive=True)


class TestDafneCopy(abstract.AbstractCopyTests, DafneFixtures):
    pass


class TestDafneGet(abstract.AbstractGetTests, DafneFixtures):
    pass


class TestDafnePut(abstract.AbstractPutTests, DafneFixtures):
    pass


class TestDafneOpen(abstract.AbstractOpenTests, DafneFixtures):
    pass


class TestDafnePipe(abstract.AbstractPipeTests, DafneFixtures):
    pass

"""Fixtures: a real cluster for the session (``cluster.py``), with
``dafne down`` at the end even when tests fail."""

import uuid

import pytest

from cluster import Cluster


@pytest.fixture(scope="session")
def cluster():
    """The cluster directory of a running cluster (one for the session)."""
    c = Cluster()
    try:
        c.up()
        yield c.dir
    finally:
        # Also after a failed `up`: a supervisor may be running.
        c.down()


@pytest.fixture
def fs(cluster):
    """The fsspec file system on the test cluster."""
    import fsspec

    return fsspec.filesystem("dafne", cluster=cluster)


@pytest.fixture
def client(cluster):
    import dafne

    return dafne.Client(cluster)


@pytest.fixture
def base(client):
    """A fresh directory for one test (its path)."""
    path = "/t-" + uuid.uuid4().hex[:12]
    client.mkdir(path)
    return path

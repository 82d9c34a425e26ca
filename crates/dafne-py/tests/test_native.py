"""The native API (dafne.Client, dafne.File) against a real cluster."""

import errno
import os
import threading

import pytest

import dafne


def test_files_round_trip_with_positions(client, base):
    p = base + "/f"
    with client.open(p, "wb") as f:
        assert f.writable() and not f.readable()
        assert f.write(b"hello ") == 6
        assert f.write(bytearray(b"world")) == 5
        assert f.write(memoryview(b"!!")) == 2
        assert f.tell() == 13
        assert f.pwrite(b"W", 6) == 1
        assert f.tell() == 13
    st = client.stat(p)
    assert st.type == "file" and st.st_size == 13 and st.st_mode & 0o170000 == 0o100000
    with client.open(p) as f:
        assert f.size == 13
        assert f.read(5) == b"hello"
        assert f.read() == b" World!!"
        assert f.read() == b""
        assert f.seek(-2, 2) == 11 and f.read(10) == b"!!"
        assert f.seek(0) == 0 and f.seek(3, 1) == 3 and f.read(2) == b"lo"
        assert f.pread(5, 6) == b"World" and f.tell() == 5
        assert f.pread(100, 10) == b"d!!"
        assert f.pread(10, 100) == b""


def test_a_large_file_in_several_pieces(client, base):
    data = os.urandom(20 << 20)
    with client.open(base + "/big", "wb") as f:
        f.write(data)
    with client.open(base + "/big") as f:
        assert f.read() == data
        assert f.pread(1 << 20, (9 << 20) - 7) == data[(9 << 20) - 7 : (10 << 20) - 7]


def test_a_file_collected_without_close_keeps_its_size(client, base):
    import gc

    p = base + "/forgotten"
    f = client.open(p, "wb")
    f.write(b"x" * 100000)
    assert client.stat(p).st_size == 0  # not published yet
    del f
    gc.collect()
    assert client.stat(p).st_size == 100000
    with client.open(p) as r:
        assert r.read() == b"x" * 100000


def test_appends_through_two_handles_both_land(client, base):
    p = base + "/two-appenders"
    with client.open(p, "xb") as f:
        f.write(b"0")
    a = client.open(p, "ab")
    b = client.open(p, "ab")
    a.write(b"A" * 10)
    b.write(b"B" * 10)
    a.write(b"C" * 5)
    assert a.tell() == 26
    a.close()
    b.close()
    assert client.stat(p).st_size == 26
    with client.open(p) as f:
        assert f.read() == b"0" + b"A" * 10 + b"B" * 10 + b"C" * 5


def test_append_truncate_fsync_and_modes(client, base):
    p = base + "/m"
    with client.open(p, "xb") as f:
        f.write(b"abc")
    with pytest.raises(FileExistsError):
        client.open(p, "xb")
    with client.open(p, "ab") as f:
        assert f.tell() == 3
        f.write(b"def")
    with client.open(p, "r+b") as f:
        f.seek(1)
        f.write(b"X")
        assert f.truncate(5) == 5
        f.fsync()
        assert client.stat(p).st_size == 5
        f.seek(0)
        assert f.read() == b"aXcde"
    with client.open(p, "w+b") as f:
        assert f.size == 0 and f.read() == b""
    client.truncate(p, 4096)
    with client.open(p) as f:
        assert f.read() == bytes(4096)
    with pytest.raises(ValueError, match="binary"):
        client.open(p, "r")
    with client.open(p) as f:
        with pytest.raises(OSError, match="not open for writing"):
            f.write(b"x")


def test_namespace_by_path(client, base):
    client.mkdir(base + "/d")
    client.mkdir(base + "/d/e", 0o700)
    assert client.stat(base + "/d/e").st_mode == 0o040700
    client.open(base + "/d/x", "wb").close()
    assert sorted(client.listdir(base + "/d")) == ["e", "x"]
    scanned = dict(client.scandir(base + "/d"))
    assert scanned["e"].type == "directory" and scanned["x"].type == "file"
    client.rename(base + "/d/x", base + "/d/e/y")
    assert client.listdir(base + "/d/e") == ["y"]
    assert client.exists(base + "/d/e/y") and not client.exists(base + "/d/x")
    client.utime(base + "/d/e/y")
    client.unlink(base + "/d/e/y")
    client.rmdir(base + "/d/e")
    assert client.listdir(base + "/d") == []


def test_errors_are_oserror_subclasses_with_errno(client, base):
    with pytest.raises(FileNotFoundError) as e:
        client.stat(base + "/missing")
    assert e.value.errno == errno.ENOENT and e.value.filename == base + "/missing"
    with pytest.raises(FileNotFoundError):
        client.open(base + "/missing")
    with pytest.raises(FileNotFoundError):
        client.open(base + "/no/such/dir/f", "wb")
    client.mkdir(base + "/d")
    with pytest.raises(FileExistsError):
        client.mkdir(base + "/d")
    with pytest.raises(IsADirectoryError):
        client.open(base + "/d")
    client.open(base + "/d/f", "wb").close()
    with pytest.raises(NotADirectoryError):
        client.listdir(base + "/d/f")
    with pytest.raises(OSError) as e:
        client.rmdir(base + "/d")
    assert e.value.errno == errno.ENOTEMPTY
    f = client.open(base + "/d/f")
    f.close()
    f.close()
    assert f.closed
    with pytest.raises(ValueError, match="closed file"):
        f.read()


def test_a_missing_cluster_names_its_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="cluster.json"):
        dafne.Client(str(tmp_path))


def test_threads_share_a_file_and_a_client(client, base):
    data = os.urandom(4 << 20)
    with client.open(base + "/t", "wb") as f:
        f.write(data)
    results = {}
    with client.open(base + "/t") as f:

        def read(i):
            off = i * (256 << 10)
            results[i] = f.pread(256 << 10, off) == data[off : off + (256 << 10)]

        threads = [threading.Thread(target=read, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert results == {i: True for i in range(16)}


def test_another_open_sees_a_writers_bytes_after_close(client, base):
    p = base + "/s"
    w = client.open(p, "wb")
    w.write(b"x" * 1000)
    r = client.open(p)
    assert r.size == 0, "the size is published at close or fsync (the file layer's size rule)"
    r.close()
    w.close()
    with client.open(p) as r:
        assert r.size == 1000

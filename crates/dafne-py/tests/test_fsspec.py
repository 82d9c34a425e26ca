"""The fsspec file system: the operations pandas, pyarrow and users call."""

import os

import fsspec
import pytest

from dafne.fs import DafneFileSystem


def test_the_protocol_is_registered():
    assert fsspec.get_filesystem_class("dafne") is DafneFileSystem


def test_paths():
    s = DafneFileSystem._strip_protocol
    assert s("dafne:///a/b/") == "/a/b"
    assert s("dafne://a//b") == "/a/b"
    assert s("a/./b") == "/a/b"
    assert s("dafne:///") == "/"
    assert DafneFileSystem._parent("dafne:///a/b") == "/a"


def test_open_write_read_and_cat(fs, base):
    p = base + "/f.bin"
    data = os.urandom(3 * (1 << 20) + 12345)
    with fs.open(p, "wb", block_size=1 << 20) as f:
        for i in range(0, len(data), 100_000):
            f.write(data[i : i + 100_000])
    assert fs.info(p)["size"] == len(data)
    assert fs.cat(p) == data
    with fs.open(p, "rb", block_size=1 << 20) as f:
        assert f.size == len(data)
        f.seek(1_000_000)
        assert f.read(2_000_000) == data[1_000_000:3_000_000]
        assert f.read() == data[3_000_000:]


def test_ranged_reads(fs, base):
    p = base + "/r"
    fs.pipe(p, b"0123456789")
    assert fs.cat_file(p, start=2, end=5) == b"234"
    assert fs.cat_file(p, start=-3) == b"789"
    assert fs.cat_file(p, end=-8) == b"01"
    assert fs.cat_file(p, start=8, end=100) == b"89"
    assert fs.cat_file(p, start=5, end=5) == b""
    assert fs.read_block(p, 3, 4) == b"3456"
    assert fs.cat_ranges([p, p], [0, 9], [1, 10]) == [b"0", b"9"]
    with fs.open(p) as f:
        f.seek(7)
        assert f.read(10) == b"789"


def test_ls_info_mkdir_makedirs(fs, base):
    fs.mkdir(base + "/a/b/c")
    with pytest.raises(FileExistsError):
        fs.mkdir(base + "/a/b/c")
    fs.makedirs(base + "/a/b/c", exist_ok=True)
    with pytest.raises(FileExistsError):
        fs.makedirs(base + "/a/b/c")
    with pytest.raises(FileNotFoundError):
        fs.mkdir(base + "/x/y", create_parents=False)
    fs.pipe(base + "/a/f", b"12345")
    listing = fs.ls(base + "/a", detail=True)
    assert [(e["name"], e["type"], e["size"]) for e in listing] == [
        (base + "/a/b", "directory", 0),
        (base + "/a/f", "file", 5),
    ]
    assert fs.ls(base + "/a", detail=False) == [base + "/a/b", base + "/a/f"]
    assert fs.ls(base + "/a/f") == [fs.info(base + "/a/f")]
    assert fs.isdir(base + "/a/b") and fs.isfile(base + "/a/f") and not fs.exists(base + "/a/g")
    assert fs.find(base) == [base + "/a/f"]
    assert fs.du(base) == 5
    assert fs.modified(base + "/a/f").year >= 2024
    with pytest.raises(FileNotFoundError):
        fs.info(base + "/nope")
    with pytest.raises(FileNotFoundError):
        fs.ls(base + "/nope")


def test_put_and_get(fs, base, tmp_path):
    src = tmp_path / "up"
    (src / "sub").mkdir(parents=True)
    (src / "one").write_bytes(os.urandom(10 << 20))
    (src / "sub" / "two").write_bytes(b"two")
    fs.put(str(tmp_path / "up" / "one"), base + "/single")
    assert fs.cat(base + "/single") == (src / "one").read_bytes()
    fs.put(str(src), base + "/tree", recursive=True)
    assert sorted(fs.find(base + "/tree")) == [base + "/tree/one", base + "/tree/sub/two"]
    fs.get(base + "/tree", str(tmp_path / "down"), recursive=True)
    assert (tmp_path / "down" / "one").read_bytes() == (src / "one").read_bytes()
    assert (tmp_path / "down" / "sub" / "two").read_bytes() == b"two"
    fs.get(base + "/single", str(tmp_path / "single"))
    assert (tmp_path / "single").read_bytes() == (src / "one").read_bytes()


def test_rm_mv_cp_touch(fs, base):
    fs.makedirs(base + "/d/e")
    fs.pipe({base + "/d/x": b"x", base + "/d/e/y": b"y"})
    with pytest.raises(OSError):
        fs.rm(base + "/d")  # a directory that holds something needs recursive
    fs.mv(base + "/d/x", base + "/d/e")  # into an existing directory
    assert fs.cat(base + "/d/e/x") == b"x"
    fs.mv(base + "/d/e", base + "/moved")  # a directory, with what it holds
    assert sorted(fs.find(base + "/moved")) == [base + "/moved/x", base + "/moved/y"]
    fs.cp(base + "/moved/x", base + "/copy")
    assert fs.cat(base + "/copy") == b"x"
    fs.touch(base + "/empty")
    assert fs.info(base + "/empty")["size"] == 0
    fs.touch(base + "/copy", truncate=False)
    assert fs.cat(base + "/copy") == b"x"
    fs.rm(base + "/moved", recursive=True)
    assert not fs.exists(base + "/moved")
    fs.rm(base + "/copy")
    fs.rm_file(base + "/empty")
    fs.rmdir(base + "/d")
    assert fs.ls(base) == []
    with pytest.raises(FileNotFoundError):
        fs.rm(base + "/nope")


def test_open_modes_and_errors(fs, base):
    with pytest.raises(FileNotFoundError):
        fs.open(base + "/nope", "rb")
    with pytest.raises(FileNotFoundError):
        fs.open(base + "/no/parent", "wb")
    with fs.open(base + "/a", "xb") as f:
        f.write(b"1")
    with pytest.raises(FileExistsError):
        fs.open(base + "/a", "xb")
    with fs.open(base + "/a", "ab") as f:
        assert f.tell() == 1
        f.write(b"2")
    assert fs.cat(base + "/a") == b"12"
    with fs.open(base + "/t.txt", "w") as f:
        f.write("text\n")
    with fs.open(base + "/t.txt", "r") as f:
        assert f.read() == "text\n"
    auto = fsspec.filesystem("dafne", cluster=fs.storage_options["cluster"], auto_mkdir=True)
    auto.pipe(base + "/made/on/write", b"w")
    assert fs.cat(base + "/made/on/write") == b"w"


def test_urls_with_storage_options(cluster, base):
    with fsspec.open("dafne://" + base + "/u", "wb", cluster=cluster) as f:
        f.write(b"through a URL")
    of = fsspec.open("dafne://" + base + "/u", "rb", cluster=cluster)
    with of as f:
        assert f.read() == b"through a URL"
    fs, path = fsspec.core.url_to_fs("dafne://" + base + "/u", cluster=cluster)
    assert isinstance(fs, DafneFileSystem) and path == base + "/u"


def test_the_default_cluster_is_dafne_home(cluster, base, monkeypatch):
    import dafne

    monkeypatch.setenv("DAFNE_HOME", cluster)
    assert base.lstrip("/") in dafne.Client().listdir("/")
    assert DafneFileSystem(skip_instance_cache=True).isdir(base)

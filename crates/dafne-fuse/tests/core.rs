//! The file-system core without the kernel: the rules `Core` adds on top
//! of the client library (POSIX create/open rights, the size rule, O_TRUNC
//! on the io servers, rename flags, open unlinked files, special files by
//! mknod), against a metadata server and io servers started in this
//! process.

use dafne_client::data::DataClient;
use dafne_client::{Errno, FileType, MetaSession, SetAttr, RENAME_EXCHANGE, RENAME_NOREPLACE};
use dafne_fuse::core::{Caller, Core, OpenMode, MAY_READ, MAY_WRITE};
use dafne_transport::{Runtime, RuntimeOptions};

fn ucx() -> Vec<(String, String)> {
    vec![("TLS".into(), "posix,sysv,cma,self,tcp".into()), ("NET_DEVICES".into(), "lo".into())]
}

/// A metadata server, two io servers and a `Core` over them.
struct Fixture {
    core: Core,
    root: u64,
    meta_addr: std::net::SocketAddr,
    io_addrs: Vec<std::net::SocketAddr>,
    secret: std::path::PathBuf,
    _servers: (dafne_meta::server::MetaServer, Vec<dafne_io::server::IoServer>),
    _rt: Runtime,
    _dir: tempfile::TempDir,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let meta = dafne_meta::server::start(&dafne_meta::server::ServeOptions {
        data_dir: dir.path().join("meta"),
        listen: "127.0.0.1:0".parse().unwrap(),
        secret: None,
        // 64 KiB stripes over both servers: small files already cross them.
        policy: dafne_meta::LayoutPolicy {
            servers: vec![0, 1],
            default_stripe_unit: 65536,
            default_stripe_count: 2,
            ..Default::default()
        },
        ucx: ucx(),
        open_grace: dafne_meta::opens::DEFAULT_GRACE,
    })
    .unwrap();
    let secret = dir.path().join("meta/cluster.secret");
    let io: Vec<_> = (0..2)
        .map(|i| {
            dafne_io::server::start(&dafne_io::server::IoArgs {
                data_dir: dir.path().join(format!("io-{i}")),
                listen: "127.0.0.1:0".parse().unwrap(),
                secret: secret.clone(),
                cache_mib: 8,
                ucx: ucx().iter().map(|(k, v)| format!("{k}={v}")).collect(),
                storage: Default::default(),
            })
            .unwrap()
        })
        .collect();
    let rt =
        Runtime::new(RuntimeOptions { name: "core-test".into(), ucx_config: ucx(), ..Default::default() }).unwrap();
    let s = dafne_auth::Secret::load(&secret).unwrap();
    let session = MetaSession::connect(&rt, meta.addr, &s, "core-test", 0, 0).unwrap();
    let data = DataClient::connect(&rt, &io.iter().map(|s| s.addr).collect::<Vec<_>>(), &s).unwrap();
    let root = session.root();
    let core = Core::new(session, data);
    let (meta_addr, io_addrs) = (meta.addr, io.iter().map(|s| s.addr).collect());
    Fixture { core, root, meta_addr, io_addrs, secret, _servers: (meta, io), _rt: rt, _dir: dir }
}

impl Fixture {
    /// Another mount's core: its own sessions, nothing shared but the
    /// servers.
    fn another_core(&self, rt: &Runtime) -> Core {
        let s = dafne_auth::Secret::load(&self.secret).unwrap();
        let session = MetaSession::connect(rt, self.meta_addr, &s, "core-test-2", 0, 0).unwrap();
        Core::new(session, DataClient::connect(rt, &self.io_addrs, &s).unwrap())
    }
}

const USER: Caller = Caller::new(1000, 1000);
const OTHER: Caller = Caller::new(1001, 1001);
const RW: OpenMode = OpenMode { read: true, write: true, trunc: false };
const S_IFREG: u32 = 0o100000;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// A directory everyone may create in, as /tmp.
fn tmp(f: &Fixture) -> u64 {
    let d = f.core.mkdir(Caller::ROOT, f.root, b"tmp", 0o777).unwrap();
    f.core.setattr(Caller::ROOT, d.ino, None, SetAttr { mode: Some(0o1777), ..Default::default() }).unwrap();
    d.ino
}

#[test]
fn a_new_file_opens_with_the_access_asked_whatever_its_mode() {
    let f = fixture();
    let tmp = tmp(&f);
    // Mode 0: nobody but root may open it later, but its creator gets the
    // descriptor it asked for, and may write and truncate through it.
    let (fh, attr) = f.core.create(USER, tmp, b"zero", 0o000, RW, true).unwrap();
    assert_eq!((attr.uid, attr.mode), (USER.uid, 0));
    assert_eq!(f.core.write(fh, 0, b"mine").unwrap(), 4);
    f.core.setattr(USER, attr.ino, Some(fh), SetAttr { size: Some(2), ..Default::default() }).unwrap();
    assert_eq!(f.core.read(fh, 0, 100).unwrap(), b"mi");
    f.core.release(fh).unwrap();
    // A later open is refused by the mode, and access(2) agrees.
    assert_eq!(f.core.open(USER, attr.ino, RW).unwrap_err(), Errno::EACCES);
    assert_eq!(f.core.access(USER, attr.ino, MAY_READ).unwrap_err(), Errno::EACCES);
    // Without an exclusive create, an existing file is opened as itself
    // (here: refused, its mode forbids it); with one, it is EEXIST.
    assert_eq!(f.core.create(USER, tmp, b"zero", 0o644, RW, false).unwrap_err(), Errno::EACCES);
    assert_eq!(f.core.create(USER, tmp, b"zero", 0o644, RW, true).unwrap_err(), Errno::EEXIST);
}

#[test]
fn sizes_follow_own_writes_while_open_and_are_published_on_flush() {
    let f = fixture();
    let (fh, attr) = f.core.create(Caller::ROOT, f.root, b"f", 0o644, RW, true).unwrap();
    let data = pattern(300_000, 1);
    f.core.write(fh, 0, &data).unwrap();
    // This mount reports its own writes; meta does not know them yet.
    assert_eq!(f.core.getattr(Caller::ROOT, attr.ino).unwrap().size, 300_000);
    // Reads stop at the known size (the io servers would return zeros).
    assert_eq!(f.core.read(fh, 299_990, 1000).unwrap(), data[299_990..]);
    assert!(f.core.read(fh, 300_000, 1000).unwrap().is_empty());
    f.core.flush(fh).unwrap();
    f.core.release(fh).unwrap();
    // After close: exact for anyone, without this mount's table.
    assert_eq!(f.core.getattr(OTHER, attr.ino).unwrap().size, 300_000);
    let (fh, _) = f.core.open(OTHER, attr.ino, OpenMode { read: true, ..Default::default() }).unwrap();
    assert_eq!(f.core.read(fh, 0, 400_000).unwrap(), data);
    // fsync through a read-only descriptor (as `sync FILE` does) works.
    f.core.fsync(fh).unwrap();
    f.core.release(fh).unwrap();
}

#[test]
fn an_explicit_mtime_survives_the_publish_at_close_and_a_later_write_does_not() {
    use dafne_client::TimeSet;
    use dafne_proto::Timespec;
    let f = fixture();
    let (fh, attr) = f.core.create(Caller::ROOT, f.root, b"m", 0o644, RW, true).unwrap();
    f.core.write(fh, 0, &pattern(100_000, 3)).unwrap();
    // What `cp -p` does: futimens on the descriptor, then close.
    let t = Timespec { sec: 981_173_106, nsec: 5 };
    let set = SetAttr { mtime: Some(TimeSet::At(t)), ..Default::default() };
    f.core.setattr(Caller::ROOT, attr.ino, Some(fh), set).unwrap();
    f.core.flush(fh).unwrap();
    f.core.release(fh).unwrap();
    let a = f.core.getattr(OTHER, attr.ino).unwrap();
    assert_eq!((a.mtime, a.size), (t, 100_000), "the size was published, the explicit mtime kept");
    // A write after it moves mtime on again.
    let (fh, _) = f.core.open(Caller::ROOT, attr.ino, RW).unwrap();
    f.core.write(fh, 100_000, b"more").unwrap();
    f.core.flush(fh).unwrap();
    f.core.release(fh).unwrap();
    let a = f.core.getattr(OTHER, attr.ino).unwrap();
    assert!(a.mtime > t && a.size == 100_004, "{a:?}");
}

#[test]
fn two_mounts_writing_different_stripes_leave_the_exact_size_after_both_close() {
    let f = fixture();
    let rt = Runtime::new(RuntimeOptions { name: "second".into(), ucx_config: ucx(), ..Default::default() }).unwrap();
    let second = f.another_core(&rt);
    let (a, attr) = f.core.create(Caller::ROOT, f.root, b"shared", 0o644, RW, true).unwrap();
    let (b, _) = second.open(Caller::ROOT, attr.ino, RW).unwrap();
    // The second mount writes the far end, the first the start; the first
    // closes first, publishing only what the servers hold then.
    second.write(b, 200_000, &pattern(50_000, 5)).unwrap();
    f.core.write(a, 0, &pattern(100_000, 4)).unwrap();
    f.core.flush(a).unwrap();
    f.core.release(a).unwrap();
    assert_eq!(second.getattr(Caller::ROOT, attr.ino).unwrap().size, 250_000, "the second mount's own writes");
    second.flush(b).unwrap();
    second.release(b).unwrap();
    let a = f.core.getattr(OTHER, attr.ino).unwrap();
    assert_eq!(a.size, 250_000);
    let (fh, _) = f.core.open(Caller::ROOT, attr.ino, RW).unwrap();
    let back = f.core.read(fh, 0, 300_000).unwrap();
    assert_eq!(back.len(), 250_000);
    assert_eq!(&back[..100_000], &pattern(100_000, 4)[..]);
    assert!(back[100_000..200_000].iter().all(|&x| x == 0), "the hole reads as zeros");
    assert_eq!(&back[200_000..], &pattern(50_000, 5)[..]);
    f.core.release(fh).unwrap();
}

#[test]
fn o_trunc_and_truncate_empty_the_io_servers_too() {
    let f = fixture();
    let (fh, attr) = f.core.create(Caller::ROOT, f.root, b"t", 0o644, RW, true).unwrap();
    f.core.write(fh, 0, &pattern(200_000, 2)).unwrap();
    f.core.release(fh).unwrap();
    // O_TRUNC, then a short write: nothing of the old bytes comes back.
    let (fh, a) = f.core.open(Caller::ROOT, attr.ino, OpenMode { trunc: true, ..RW }).unwrap();
    assert_eq!(a.size, 0);
    f.core.write(fh, 0, b"new").unwrap();
    f.core.release(fh).unwrap();
    assert_eq!(f.core.getattr(Caller::ROOT, attr.ino).unwrap().size, 3);
    // Extending by truncate reads as zeros, not as the old bytes.
    f.core.setattr(Caller::ROOT, attr.ino, None, SetAttr { size: Some(150_000), ..Default::default() }).unwrap();
    let (fh, _) = f.core.open(Caller::ROOT, attr.ino, RW).unwrap();
    let back = f.core.read(fh, 0, 200_000).unwrap();
    assert_eq!(back.len(), 150_000);
    assert_eq!(&back[..3], b"new");
    assert!(back[3..].iter().all(|&b| b == 0), "old bytes resurfaced after truncation");
    f.core.release(fh).unwrap();
    // Truncate by path needs write permission.
    assert_eq!(
        f.core.setattr(USER, attr.ino, None, SetAttr { size: Some(0), ..Default::default() }).unwrap_err(),
        Errno::EACCES
    );
}

#[test]
fn an_unlinked_open_file_keeps_its_attributes_and_data() {
    let f = fixture();
    let (fh, attr) = f.core.create(Caller::ROOT, f.root, b"u", 0o644, RW, true).unwrap();
    f.core.write(fh, 0, b"before").unwrap();
    f.core.unlink(Caller::ROOT, f.root, b"u").unwrap();
    assert_eq!(f.core.lookup(Caller::ROOT, f.root, b"u").unwrap_err(), Errno::ENOENT);
    let a = f.core.getattr(Caller::ROOT, attr.ino).unwrap();
    assert_eq!((a.nlink, a.size), (0, 6));
    f.core.write(fh, 6, b" after").unwrap();
    assert_eq!(f.core.read(fh, 0, 100).unwrap(), b"before after");
    f.core.flush(fh).unwrap();
    f.core.release(fh).unwrap();
    // Once closed, it is gone.
    assert_eq!(f.core.getattr(Caller::ROOT, attr.ino).unwrap_err(), Errno::ENOENT);
}

#[test]
fn rename_noreplace_refuses_an_existing_name() {
    let f = fixture();
    f.core.mknod(Caller::ROOT, f.root, b"a", S_IFREG | 0o644, 0).unwrap();
    f.core.mknod(Caller::ROOT, f.root, b"b", S_IFREG | 0o644, 0).unwrap();
    assert_eq!(f.core.rename(Caller::ROOT, f.root, b"a", f.root, b"b", RENAME_NOREPLACE).unwrap_err(), Errno::EEXIST);
    f.core.rename(Caller::ROOT, f.root, b"a", f.root, b"c", RENAME_NOREPLACE).unwrap();
    f.core.rename(Caller::ROOT, f.root, b"c", f.root, b"b", 0).unwrap();
    let (entries, _) = f.core.readdir(Caller::ROOT, f.root, 0, 100).unwrap();
    let names: Vec<_> = entries.iter().map(|e| (e.name.clone(), e.kind)).collect();
    assert_eq!(names, vec![(b"b".to_vec(), FileType::Regular)]);
    // access(2) by the rules the server applies.
    let d = f.core.mkdir(Caller::ROOT, f.root, b"d", 0o750).unwrap();
    assert!(f.core.access(Caller::ROOT, d.ino, MAY_READ | MAY_WRITE).is_ok());
    assert_eq!(f.core.access(USER, d.ino, MAY_READ).unwrap_err(), Errno::EACCES);
}

#[test]
fn rename_exchange_swaps_and_xattrs_reach_meta() {
    let f = fixture();
    let a = f.core.mknod(Caller::ROOT, f.root, b"xa", S_IFREG | 0o644, 0).unwrap();
    let b = f.core.mkdir(Caller::ROOT, f.root, b"xb", 0o755).unwrap();
    f.core.rename(Caller::ROOT, f.root, b"xa", f.root, b"xb", RENAME_EXCHANGE).unwrap();
    assert_eq!(f.core.lookup(Caller::ROOT, f.root, b"xa").unwrap().ino, b.ino);
    assert_eq!(f.core.lookup(Caller::ROOT, f.root, b"xb").unwrap().ino, a.ino);
    assert_eq!(f.core.rename(Caller::ROOT, f.root, b"xa", f.root, b"none", RENAME_EXCHANGE), Err(Errno::ENOENT));
    // Extended attributes, as the kernel asks for them.
    f.core.setxattr(Caller::ROOT, a.ino, b"user.k", b"value", 0).unwrap();
    f.core.setxattr(Caller::ROOT, a.ino, b"trusted.t", b"", 0).unwrap();
    assert_eq!(f.core.getxattr(Caller::ROOT, a.ino, b"user.k").unwrap(), b"value");
    assert_eq!(f.core.listxattr(Caller::ROOT, a.ino).unwrap(), b"trusted.t\0user.k\0");
    assert_eq!(f.core.listxattr(USER, a.ino).unwrap(), b"user.k\0", "trusted.* is root's");
    assert_eq!(f.core.setxattr(USER, a.ino, b"user.k", b"v", 0), Err(Errno::EACCES));
    f.core.removexattr(Caller::ROOT, a.ino, b"user.k").unwrap();
    assert_eq!(f.core.getxattr(Caller::ROOT, a.ino, b"user.k"), Err(Errno::ENODATA));
    // File capabilities: answered without meta, refused to store.
    assert_eq!(f.core.getxattr(Caller::ROOT, a.ino, b"security.capability"), Err(Errno::ENODATA));
    assert_eq!(f.core.setxattr(Caller::ROOT, a.ino, b"security.capability", b"x", 0), Err(Errno::EOPNOTSUPP));
}

#[test]
fn mknod_makes_fifos_sockets_and_devices_that_list_and_stat_with_their_type() {
    let f = fixture();
    let t = tmp(&f);
    // (mode type bits, name, kind, rdev asked, rdev kept)
    let cases = [
        (libc::S_IFIFO, b"fifo".as_slice(), FileType::Fifo, 0u64, 0u64),
        (libc::S_IFSOCK, b"sock", FileType::Socket, 0, 0),
        (libc::S_IFCHR, b"null", FileType::CharDevice, 0x0103, 0x0103), // makedev(1, 3)
        (libc::S_IFBLK, b"sda1", FileType::BlockDevice, 0x0801, 0x0801), // makedev(8, 1)
        (0, b"plain", FileType::Regular, 0, 0),
    ];
    for (bits, name, kind, rdev, kept) in cases {
        let a = f.core.mknod(Caller::ROOT, t, name, bits | 0o640, rdev).unwrap();
        assert_eq!((a.kind, a.mode, a.rdev, a.size), (kind, 0o640, kept, 0), "{kind:?}");
        let g = f.core.getattr(Caller::ROOT, a.ino).unwrap();
        assert_eq!((g.kind, g.rdev), (kind, kept));
    }
    // Plain and attribute-carrying listings both report the types.
    let (entries, _) = f.core.readdir(Caller::ROOT, t, 0, 100).unwrap();
    let want: Vec<_> = cases.iter().map(|(_, n, k, ..)| (n.to_vec(), *k)).collect();
    assert_eq!(entries.iter().map(|e| (e.name.clone(), e.kind)).collect::<Vec<_>>(), want);
    let plus = f.core.readdir_plus(Caller::ROOT, t, 0, 100).unwrap();
    let got: Vec<_> = plus.entries.iter().map(|(e, a)| (e.name.clone(), a.kind, a.rdev)).collect();
    assert_eq!(got, cases.iter().map(|(_, n, k, _, r)| (n.to_vec(), *k, *r)).collect::<Vec<_>>());
    // A user makes FIFOs and sockets, not devices (the server's rule, as
    // Linux without CAP_MKNOD).
    let p = f.core.mknod(USER, t, b"users-fifo", libc::S_IFIFO | 0o600, 0).unwrap();
    assert_eq!((p.uid, p.kind), (USER.uid, FileType::Fifo));
    f.core.mknod(USER, t, b"users-sock", libc::S_IFSOCK | 0o600, 0).unwrap();
    for bits in [libc::S_IFCHR, libc::S_IFBLK] {
        assert_eq!(f.core.mknod(USER, t, b"dev", bits | 0o600, 0x0103).unwrap_err(), Errno::EPERM);
    }
    assert_eq!(f.core.mknod(USER, t, b"fifo", libc::S_IFIFO | 0o600, 0).unwrap_err(), Errno::EEXIST);
    // Types mknod does not make.
    for bits in [libc::S_IFDIR, libc::S_IFLNK, 0o030000] {
        assert_eq!(f.core.mknod(Caller::ROOT, t, b"x", bits | 0o755, 0).unwrap_err(), Errno::EINVAL, "{bits:o}");
    }
    // A special file has no data to open here; a regular one made by
    // mknod opens and takes bytes.
    let fifo = f.core.lookup(Caller::ROOT, t, b"fifo").unwrap();
    assert_eq!(f.core.open(Caller::ROOT, fifo.ino, RW).unwrap_err(), Errno::ENXIO);
    let plain = f.core.lookup(Caller::ROOT, t, b"plain").unwrap();
    let (fh, _) = f.core.open(Caller::ROOT, plain.ino, RW).unwrap();
    f.core.write(fh, 0, b"data").unwrap();
    f.core.release(fh).unwrap();
    assert_eq!(f.core.getattr(Caller::ROOT, plain.ino).unwrap().size, 4);
    // Removed like any file.
    f.core.unlink(USER, t, b"users-fifo").unwrap();
    f.core.rename(Caller::ROOT, t, b"null", f.root, b"null", 0).unwrap();
    assert_eq!(f.core.lookup(Caller::ROOT, f.root, b"null").unwrap().rdev, 0x0103);
}

#[test]
fn statfs_reports_the_io_servers_capacity() {
    let f = fixture();
    let s = f.core.statfs(USER).unwrap();
    assert!(s.blocks > 0 && s.bfree <= s.blocks && s.bavail <= s.blocks, "{s:?}");
    assert!(s.files >= 1 && s.namelen == 255, "{s:?}");
}

#[test]
fn listings_with_attributes_page_by_cookie_and_show_this_mounts_sizes() {
    let f = fixture();
    let d = f.core.mkdir(Caller::ROOT, f.root, b"d", 0o755).unwrap().ino;
    for i in 0..40 {
        f.core.mknod(Caller::ROOT, d, format!("f{i:02}").as_bytes(), S_IFREG | 0o600, 0).unwrap();
    }
    // An open file with unpublished writes lists with its local size.
    let f07 = f.core.lookup(Caller::ROOT, d, b"f07").unwrap().ino;
    let (fh, _) = f.core.open(Caller::ROOT, f07, RW).unwrap();
    f.core.write(fh, 0, &pattern(12_345, 7)).unwrap();
    // Page through 40 entries 16 at a time; one entry disappears between
    // pages and is simply not listed.
    let mut seen = Vec::new();
    let mut cookie = 0;
    loop {
        let page = f.core.readdir_plus(Caller::ROOT, d, cookie, 16).unwrap();
        for (e, a) in &page.entries {
            assert_eq!(e.ino, a.ino);
            assert_eq!((a.kind, a.mode), (FileType::Regular, 0o600));
            let want = if e.ino == f07 { 12_345 } else { 0 };
            assert_eq!(a.size, want, "{}", String::from_utf8_lossy(&e.name));
            seen.push(String::from_utf8(e.name.clone()).unwrap());
        }
        if seen.len() == 16 {
            f.core.unlink(Caller::ROOT, d, b"f30").unwrap();
        }
        if page.eof {
            break;
        }
        assert_ne!(page.next, cookie, "a page that is not the last moves the cookie on");
        cookie = page.next;
    }
    let want: Vec<String> = (0..40).filter(|&i| i != 30).map(|i| format!("f{i:02}")).collect();
    assert_eq!(seen, want);
    f.core.release(fh).unwrap();
}

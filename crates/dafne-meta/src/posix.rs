//! POSIX rules the metadata server enforces, as pure functions so they are
//! tested once and used by every store.

use dafne_proto::{Attr, Errno, FileType, NAME_MAX, XATTR_NAME_MAX};

use crate::store::Cred;

pub const MAY_READ: u32 = 4;
pub const MAY_WRITE: u32 = 2;
pub const MAY_EXEC: u32 = 1;

pub const S_ISUID: u32 = 0o4000;
pub const S_ISGID: u32 = 0o2000;
pub const S_ISVTX: u32 = 0o1000;

/// Whether `cred` may access `attr` with every bit of `want` (MAY_*).
/// Root may do anything, except execute a file with no execute bit at all.
pub fn may(cred: &Cred, attr: &Attr, want: u32) -> bool {
    if cred.uid == 0 {
        return want & MAY_EXEC == 0 || attr.kind == dafne_proto::FileType::Directory || attr.mode & 0o111 != 0;
    }
    let bits = if cred.uid == attr.uid {
        (attr.mode >> 6) & 7
    } else if cred.in_group(attr.gid) {
        (attr.mode >> 3) & 7
    } else if cred.groups.is_omitted() {
        // The caller may be in the file's group, whose class then applies
        // even where it grants less than the other class: only what both
        // grant is granted (a refusal is asked again with the groups).
        (attr.mode >> 3) & attr.mode & 7
    } else {
        attr.mode & 7
    };
    bits & want == want
}

/// `Err(EACCES)` unless [`may`].
pub fn check(cred: &Cred, attr: &Attr, want: u32) -> Result<(), Errno> {
    if may(cred, attr, want) {
        Ok(())
    } else {
        Err(Errno::EACCES)
    }
}

/// A name that may be created in a directory: 1..=NAME_MAX bytes, no `/`
/// or NUL, not `.` or `..`.
pub fn valid_new_name(name: &[u8]) -> Result<(), Errno> {
    if name.len() > NAME_MAX {
        return Err(Errno::ENAMETOOLONG);
    }
    if name.is_empty() || name.contains(&b'/') || name.contains(&0) {
        return Err(Errno::EINVAL);
    }
    if name == b"." || name == b".." {
        return Err(Errno::EEXIST);
    }
    Ok(())
}

/// A name that may be looked up (`.` and `..` allowed).
pub fn valid_lookup_name(name: &[u8]) -> Result<(), Errno> {
    if name.len() > NAME_MAX {
        return Err(Errno::ENAMETOOLONG);
    }
    if name.is_empty() || name.contains(&b'/') || name.contains(&0) {
        return Err(Errno::EINVAL);
    }
    Ok(())
}

/// Restricted deletion in a sticky directory: only the owner of the entry,
/// the owner of the directory, or root may remove or rename it.
pub fn sticky_allows(cred: &Cred, dir: &Attr, victim: &Attr) -> bool {
    dir.mode & S_ISVTX == 0 || cred.uid == 0 || cred.uid == dir.uid || cred.uid == victim.uid
}

/// The namespaces of extended attribute names that dafne stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XattrNs {
    User,
    Trusted,
    Security,
}

/// The namespace of an extended attribute name, by Linux's rules: `ERANGE`
/// for an empty name or one above [`XATTR_NAME_MAX`], `EOPNOTSUPP` for a
/// namespace not stored here (`system.*`, which Linux keeps for ACLs, or
/// none), `EINVAL` for a prefix alone (`user.`) or a NUL inside (no C
/// string carries one).
pub fn xattr_namespace(name: &[u8]) -> Result<XattrNs, Errno> {
    if name.is_empty() || name.len() > XATTR_NAME_MAX {
        return Err(Errno::ERANGE);
    }
    if name.contains(&0) {
        return Err(Errno::EINVAL);
    }
    let spaces: [(&[u8], XattrNs); 3] =
        [(b"user.", XattrNs::User), (b"trusted.", XattrNs::Trusted), (b"security.", XattrNs::Security)];
    for (prefix, ns) in spaces {
        if let Some(rest) = name.strip_prefix(prefix) {
            return if rest.is_empty() { Err(Errno::EINVAL) } else { Ok(ns) };
        }
    }
    Err(Errno::EOPNOTSUPP)
}

/// Whether `cred` may read (`write` false) or set and remove (`write`
/// true) an attribute of namespace `ns` on the inode `attr`, as Linux's
/// `xattr_permission` with the capability module's rule for `security.*`:
/// * `trusted.*`: root only; others get `EPERM` to write, and `ENODATA` to
///   read (for them the attribute is not there).
/// * `security.*`: anyone reads; only root writes (`EPERM`).
/// * `user.*`: only on regular files and directories (`EPERM` to write,
///   `ENODATA` to read elsewhere); in a sticky directory only its owner or
///   root writes (`EPERM`); then read or write permission on the inode
///   (`EACCES`).
pub fn xattr_access(cred: &Cred, attr: &Attr, ns: XattrNs, write: bool) -> Result<(), Errno> {
    let refused = if write { Errno::EPERM } else { Errno::ENODATA };
    match ns {
        XattrNs::Trusted if cred.uid != 0 => Err(refused),
        XattrNs::Trusted => Ok(()),
        XattrNs::Security if write && cred.uid != 0 => Err(Errno::EPERM),
        XattrNs::Security => Ok(()),
        XattrNs::User => {
            if !matches!(attr.kind, FileType::Regular | FileType::Directory) {
                return Err(refused);
            }
            let sticky_dir = attr.kind == FileType::Directory && attr.mode & S_ISVTX != 0;
            if write && sticky_dir && cred.uid != 0 && cred.uid != attr.uid {
                return Err(Errno::EPERM);
            }
            check(cred, attr, if write { MAY_WRITE } else { MAY_READ })
        }
    }
}

/// Whether `cred` sees the attribute `name` in a listing: `trusted.*` only
/// root does, as Linux lists them only to `CAP_SYS_ADMIN`.
pub fn xattr_listed(cred: &Cred, name: &[u8]) -> bool {
    cred.uid == 0 || !name.starts_with(b"trusted.")
}

#[cfg(test)]
mod tests {
    use super::*;
    use dafne_proto::{FileType, Timespec};

    fn attr(kind: FileType, mode: u32, uid: u32, gid: u32) -> Attr {
        let t = Timespec { sec: 0, nsec: 0 };
        Attr { ino: 5, kind, mode, nlink: 1, uid, gid, rdev: 0, size: 0, blocks: 0, atime: t, mtime: t, ctime: t }
    }

    #[test]
    fn owner_group_other_bits() {
        let a = attr(FileType::Regular, 0o640, 10, 20);
        assert!(may(&Cred::new(10, 99), &a, MAY_READ | MAY_WRITE));
        assert!(!may(&Cred::new(10, 99), &a, MAY_EXEC));
        assert!(may(&Cred::new(11, 20), &a, MAY_READ));
        assert!(!may(&Cred::new(11, 20), &a, MAY_WRITE));
        assert!(!may(&Cred::new(11, 21), &a, MAY_READ));
        // The owner class applies even when it grants less than the group.
        let b = attr(FileType::Regular, 0o070, 10, 20);
        assert!(!may(&Cred::new(10, 20), &b, MAY_READ));
    }

    #[test]
    fn supplementary_groups_select_the_group_class() {
        let a = attr(FileType::Directory, 0o710, 10, 20);
        let member = Cred::with_groups(11, 99, dafne_proto::Groups::new(&[5, 20]));
        assert!(may(&member, &a, MAY_EXEC));
        assert!(!may(&member, &a, MAY_READ));
        assert!(!may(&Cred::with_groups(11, 99, dafne_proto::Groups::new(&[5, 21])), &a, MAY_EXEC));
        assert!(!may(&Cred::new(11, 99), &a, MAY_EXEC));
    }

    #[test]
    fn root_bypasses_but_cannot_exec_non_executables() {
        let a = attr(FileType::Regular, 0o600, 10, 20);
        assert!(may(&Cred::root(), &a, MAY_READ | MAY_WRITE));
        assert!(!may(&Cred::root(), &a, MAY_EXEC));
        let d = attr(FileType::Directory, 0o000, 10, 20);
        assert!(may(&Cred::root(), &d, MAY_EXEC));
    }

    #[test]
    fn names() {
        assert_eq!(valid_new_name(&[b'a'; 256]), Err(Errno::ENAMETOOLONG));
        assert_eq!(valid_new_name(b"a/b"), Err(Errno::EINVAL));
        assert_eq!(valid_new_name(b""), Err(Errno::EINVAL));
        assert_eq!(valid_new_name(b".."), Err(Errno::EEXIST));
        assert!(valid_new_name(&[b'a'; 255]).is_ok());
        assert!(valid_lookup_name(b"..").is_ok());
    }

    #[test]
    fn xattr_names_need_a_known_namespace() {
        assert_eq!(xattr_namespace(b"user.a"), Ok(XattrNs::User));
        assert_eq!(xattr_namespace(b"trusted.a"), Ok(XattrNs::Trusted));
        assert_eq!(xattr_namespace(b"security.selinux"), Ok(XattrNs::Security));
        for other in [&b"system.posix_acl_access"[..], b"a", b"User.a", b"userx.a", b"os2.a"] {
            assert_eq!(xattr_namespace(other), Err(Errno::EOPNOTSUPP), "{other:?}");
        }
        assert_eq!(xattr_namespace(b"user."), Err(Errno::EINVAL));
        assert_eq!(xattr_namespace(b"user.a\0b"), Err(Errno::EINVAL));
        assert_eq!(xattr_namespace(b""), Err(Errno::ERANGE));
        let mut long = b"user.".to_vec();
        long.resize(XATTR_NAME_MAX, b'n');
        assert_eq!(xattr_namespace(&long), Ok(XattrNs::User));
        long.push(b'n');
        assert_eq!(xattr_namespace(&long), Err(Errno::ERANGE));
    }

    #[test]
    fn xattr_access_follows_linux() {
        let f = attr(FileType::Regular, 0o640, 10, 20);
        let (owner, member, other, root) = (Cred::new(10, 1), Cred::new(11, 20), Cred::new(12, 1), Cred::root());
        // user.*: the file's permission bits.
        assert_eq!(xattr_access(&owner, &f, XattrNs::User, true), Ok(()));
        assert_eq!(xattr_access(&member, &f, XattrNs::User, false), Ok(()));
        assert_eq!(xattr_access(&member, &f, XattrNs::User, true), Err(Errno::EACCES));
        assert_eq!(xattr_access(&other, &f, XattrNs::User, false), Err(Errno::EACCES));
        // user.* only on regular files and directories.
        let link = attr(FileType::Symlink, 0o777, 10, 20);
        assert_eq!(xattr_access(&root, &link, XattrNs::User, true), Err(Errno::EPERM));
        assert_eq!(xattr_access(&root, &link, XattrNs::User, false), Err(Errno::ENODATA));
        let fifo = attr(FileType::Fifo, 0o666, 10, 20);
        assert_eq!(xattr_access(&owner, &fifo, XattrNs::User, true), Err(Errno::EPERM));
        // A sticky directory: only its owner (or root) writes, even with w.
        let tmp = attr(FileType::Directory, 0o1777, 10, 20);
        assert_eq!(xattr_access(&other, &tmp, XattrNs::User, true), Err(Errno::EPERM));
        assert_eq!(xattr_access(&other, &tmp, XattrNs::User, false), Ok(()));
        assert_eq!(xattr_access(&owner, &tmp, XattrNs::User, true), Ok(()));
        // trusted.*: root only; others do not even see it.
        assert_eq!(xattr_access(&owner, &f, XattrNs::Trusted, true), Err(Errno::EPERM));
        assert_eq!(xattr_access(&owner, &f, XattrNs::Trusted, false), Err(Errno::ENODATA));
        assert_eq!(xattr_access(&root, &link, XattrNs::Trusted, true), Ok(()));
        assert!(!xattr_listed(&owner, b"trusted.a"));
        assert!(xattr_listed(&root, b"trusted.a"));
        assert!(xattr_listed(&owner, b"user.a"));
        // security.*: anyone reads, root writes.
        assert_eq!(xattr_access(&other, &f, XattrNs::Security, false), Ok(()));
        assert_eq!(xattr_access(&owner, &f, XattrNs::Security, true), Err(Errno::EPERM));
        assert_eq!(xattr_access(&root, &f, XattrNs::Security, true), Ok(()));
    }

    #[test]
    fn sticky_directories() {
        let dir = attr(FileType::Directory, 0o1777, 1, 1);
        let f = attr(FileType::Regular, 0o644, 7, 7);
        assert!(sticky_allows(&Cred::new(7, 7), &dir, &f));
        assert!(sticky_allows(&Cred::new(1, 9), &dir, &f));
        assert!(!sticky_allows(&Cred::new(8, 7), &dir, &f));
    }
}

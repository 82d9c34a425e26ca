//! POSIX rules the metadata server enforces, as pure functions so they are
//! tested once and used by every store.

use dafne_proto::{Attr, Errno, NAME_MAX};

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
    fn sticky_directories() {
        let dir = attr(FileType::Directory, 0o1777, 1, 1);
        let f = attr(FileType::Regular, 0o644, 7, 7);
        assert!(sticky_allows(&Cred::new(7, 7), &dir, &f));
        assert!(sticky_allows(&Cred::new(1, 9), &dir, &f));
        assert!(!sticky_allows(&Cred::new(8, 7), &dir, &f));
    }
}

//! A FUSE file system for power-loss tests: it keeps, in memory, what a disk would hold
//! after a power cut apart from what a program has only written so far, and can throw the
//! difference away.
//!
//! Every inode has a current state (what reads see) and a durable state (what survives a
//! cut). A regular file's durable state is its data and size as of its last fsync or
//! fdatasync; a directory's is its entries as of its last fsync (the kernel sends FSYNCDIR
//! for `File::open(dir)?.sync_all()`). Nothing else makes anything durable: not closing a
//! file, not an fsync of a file for the entry that names it, not a sync of a parent for a
//! child directory's entries. So a file created, written and fdatasync'd in a directory
//! that is never synced is gone after a cut, and an unlink or rename whose directory is
//! not synced is undone. This is the strict POSIX reading, which every real file system
//! is allowed to show (ext4 often hides a missing directory sync because it commits
//! everything in one journal; the next file system may not).
//!
//! [`PowerLossFs::cut_power`] is the cut: it unmounts (the program using the mount must be
//! dead by then, e.g. `kill -9`ed), makes every durable state the current one, drops the
//! inodes no durable entry reaches, and mounts again, so the kernel's caches start empty
//! too. Requests that an earlier mount's session still delivers are refused, so nothing
//! from before the cut leaks into the state after it.
//!
//! Simplifications, none of which streamgate depends on: unsynced writes are lost whole
//! (a real disk may keep some of them); mode, owner and times are not part of the model
//! (they change at once and survive a cut); a directory moved between two directories of
//! which only one was synced may be found in both after a cut, in which case only the
//! first one found keeps it; file locks are left to the kernel (POSIX and flock locks are
//! local to this machine anyway); there are no symlinks, device nodes or extended
//! attributes.
//!
//! [`Mutation`]s break the model on purpose, inside one directory, to show that a test
//! built on it notices a missing sync.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo, LockOwner, MountOption,
    OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};

/// A deliberate break of the durability model, inside one directory: it stands for a
/// write path with one kind of sync removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mutation {
    /// fsync and fdatasync of regular files make nothing durable.
    IgnoreFileSyncs,
    /// fsync of directories makes nothing durable.
    IgnoreDirSyncs,
}

/// A mounted power-loss file system; unmounted when dropped.
pub struct PowerLossFs {
    mountpoint: PathBuf,
    /// `mountpoint` with every symlink resolved, as the kernel lists it among the mounts.
    canonical_mountpoint: PathBuf,
    state: Arc<Mutex<State>>,
    session: Option<fuser::BackgroundSession>,
}

impl PowerLossFs {
    /// Mounts an empty file system at `mountpoint` (an existing empty directory).
    pub fn mount(mountpoint: &Path) -> io::Result<PowerLossFs> {
        Self::mount_with(mountpoint, None)
    }

    /// Like [`PowerLossFs::mount`], with `mutation` applied to every file and directory
    /// created inside `inside` (a path relative to the mount's root), at any depth, but
    /// not to `inside` itself.
    pub fn mount_mutated(
        mountpoint: &Path,
        mutation: Mutation,
        inside: &Path,
    ) -> io::Result<PowerLossFs> {
        Self::mount_with(mountpoint, Some((mutation, inside.to_path_buf())))
    }

    fn mount_with(
        mountpoint: &Path,
        mutation: Option<(Mutation, PathBuf)>,
    ) -> io::Result<PowerLossFs> {
        let mut fs = PowerLossFs {
            mountpoint: mountpoint.to_path_buf(),
            canonical_mountpoint: mountpoint.canonicalize()?,
            state: Arc::new(Mutex::new(State::new(mutation))),
            session: None,
        };
        fs.attach()?;
        Ok(fs)
    }

    /// Where the file system is mounted.
    pub fn path(&self) -> &Path {
        &self.mountpoint
    }

    /// The power cut: unmounts, throws away everything not durable, and mounts what is
    /// left at the same place. Whatever used the mount must have ended first.
    pub fn cut_power(&mut self) -> io::Result<()> {
        self.detach()?;
        lock(&self.state).discard_volatile();
        self.attach()
    }

    fn attach(&mut self) -> io::Result<()> {
        let generation = lock(&self.state).generation;
        let mount = Mount {
            state: self.state.clone(),
            generation,
        };
        let mut config = fuser::Config::default();
        config.mount_options = vec![
            MountOption::FSName("streamgate-power-loss".into()),
            MountOption::RW,
        ];
        let session = fuser::spawn_mount(mount, &self.mountpoint, &config).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "mounting the power-loss test file system (FUSE) at {} failed: {e}; it \
                     needs /dev/fuse and the right to mount (root)",
                    self.mountpoint.display()
                ),
            )
        })?;
        self.session = Some(session);
        Ok(())
    }

    fn detach(&mut self) -> io::Result<()> {
        // From here on the old session's requests are refused, even if the unmount below
        // has to leave it running.
        lock(&self.state).generation += 1;
        let Some(session) = self.session.take() else {
            return Ok(());
        };
        // `umount_and_join` is umount(2), then a join of the session's thread, and gives
        // one error for both; whether the mount is still there tells them apart.
        let Err(e) = session.umount_and_join() else {
            return Ok(());
        };
        if is_mount_point(&self.canonical_mountpoint)? {
            return Err(io::Error::new(
                e.kind(),
                format!(
                    "unmounting the power-loss test file system at {} failed (is a process \
                     still using it?): {e}",
                    self.mountpoint.display()
                ),
            ));
        }
        // Unmounted, but the session's read of /dev/fuse failed with ECONNABORTED: the
        // unmount shut the connection down (fuse_abort_conn) just after that read had
        // taken a request off the kernel's queue, before it could hand it over. The
        // request is then ended with an error, which is what the unmount does to every
        // request in flight anyway. One is often in flight at a cut: the server was
        // killed with files open on the mount, and the kernel sends their RELEASEs in
        // the background, after the process is gone. fuser ends the session cleanly only
        // on ENODEV, which is what reads get after an unmount that caught no request
        // half-way.
        if e.kind() == io::ErrorKind::ConnectionAborted {
            return Ok(());
        }
        Err(io::Error::new(
            e.kind(),
            format!(
                "the power-loss test file system at {} was unmounted, but its session \
                 ended with an error: {e}",
                self.mountpoint.display()
            ),
        ))
    }

    #[cfg(test)]
    fn sync_requests(&self) -> (u64, u64) {
        let state = lock(&self.state);
        (state.fsync_requests, state.fsyncdir_requests)
    }
}

impl Drop for PowerLossFs {
    fn drop(&mut self) {
        let _ = self.detach();
    }
}

/// Whether something is mounted at `path` (canonical) in this process's mount namespace.
/// It reads /proc/self/mountinfo rather than looking at `path` itself, since a look at a
/// FUSE mount whose session has ended would hang or fail.
fn is_mount_point(path: &Path) -> io::Result<bool> {
    let mountinfo = std::fs::read("/proc/self/mountinfo")?;
    let path = path.as_os_str().as_bytes();
    Ok(mountinfo.split(|&b| b == b'\n').any(|line| {
        // The fifth field is the mount point.
        line.split(|&b| b == b' ')
            .nth(4)
            .is_some_and(|field| unescape_mountinfo(field) == path)
    }))
}

/// A mountinfo field with its octal escapes (`\040` for a space, and so on) undone.
fn unescape_mountinfo(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let octal = field.get(i + 1..i + 4).and_then(|digits| {
            std::str::from_utf8(digits)
                .ok()
                .and_then(|digits| u8::from_str_radix(digits, 8).ok())
        });
        match (field[i], octal) {
            (b'\\', Some(byte)) => {
                out.push(byte);
                i += 4;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    out
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // The session must go on answering the kernel after a test thread panicked with the
    // lock held: a file system that stops answering hangs every process using it.
    state
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

const ROOT: u64 = INodeNo::ROOT.0;
/// The file-type bits of a mode, and those of a regular file.
const S_IFMT: u32 = 0o170000;
const S_IFREG: u32 = 0o100000;
/// How long the kernel may cache names and attributes. Every change goes through the
/// kernel, so its caches are never stale within one mount; a cut remounts.
const TTL: Duration = Duration::from_secs(1);

struct State {
    inodes: HashMap<u64, Inode>,
    next_ino: u64,
    /// Bumped by each unmount: requests from an earlier mount are refused.
    generation: u64,
    mutation: Option<(Mutation, PathBuf)>,
    /// Directory listings, taken at opendir, by file handle: a program that removes
    /// entries while it lists a directory still sees each remaining entry once.
    listings: HashMap<u64, Vec<(u64, FileType, OsString)>>,
    next_handle: u64,
    /// FSYNC and FSYNCDIR requests received: a unit test checks which one the kernel
    /// sends for a directory's sync.
    fsync_requests: u64,
    fsyncdir_requests: u64,
}

struct Inode {
    kind: Kind,
    perm: u16,
    uid: u32,
    gid: u32,
    atime: SystemTime,
    mtime: SystemTime,
    ctime: SystemTime,
    /// The number of current directory entries naming this inode (files; directories
    /// report 2).
    links: u32,
    /// Whether the mutation applies: created somewhere inside the mutation's directory.
    mutated: bool,
}

enum Kind {
    File {
        current: Arc<Vec<u8>>,
        durable: Arc<Vec<u8>>,
    },
    Dir {
        /// The directory holding this one now (the root's is itself).
        parent: u64,
        current: BTreeMap<OsString, u64>,
        durable: BTreeMap<OsString, u64>,
    },
}

impl State {
    fn new(mutation: Option<(Mutation, PathBuf)>) -> State {
        let mut inodes = HashMap::new();
        inodes.insert(ROOT, Inode::new(new_dir(ROOT), 0o755, 0, 0, false));
        State {
            inodes,
            next_ino: ROOT + 1,
            generation: 0,
            mutation,
            listings: HashMap::new(),
            next_handle: 1,
            fsync_requests: 0,
            fsyncdir_requests: 0,
        }
    }

    fn inode(&self, ino: u64) -> Result<&Inode, Errno> {
        self.inodes.get(&ino).ok_or(Errno::ENOENT)
    }

    fn inode_mut(&mut self, ino: u64) -> Result<&mut Inode, Errno> {
        self.inodes.get_mut(&ino).ok_or(Errno::ENOENT)
    }

    fn entries(&self, dir: u64) -> Result<&BTreeMap<OsString, u64>, Errno> {
        match &self.inode(dir)?.kind {
            Kind::Dir { current, .. } => Ok(current),
            Kind::File { .. } => Err(Errno::ENOTDIR),
        }
    }

    fn entries_mut(&mut self, dir: u64) -> Result<&mut BTreeMap<OsString, u64>, Errno> {
        let inode = self.inode_mut(dir)?;
        let now = SystemTime::now();
        inode.mtime = now;
        inode.ctime = now;
        match &mut inode.kind {
            Kind::Dir { current, .. } => Ok(current),
            Kind::File { .. } => Err(Errno::ENOTDIR),
        }
    }

    fn child(&self, dir: u64, name: &OsStr) -> Result<u64, Errno> {
        self.entries(dir)?.get(name).copied().ok_or(Errno::ENOENT)
    }

    /// The path of directory `dir` from the root, following current entries.
    fn path_of(&self, mut dir: u64) -> PathBuf {
        let mut names = Vec::new();
        while dir != ROOT {
            let Ok(Inode {
                kind: Kind::Dir { parent, .. },
                ..
            }) = self.inode(dir)
            else {
                break;
            };
            let parent = *parent;
            if let Ok(entries) = self.entries(parent) {
                if let Some((name, _)) = entries.iter().find(|(_, ino)| **ino == dir) {
                    names.push(name.clone());
                }
            }
            dir = parent;
        }
        names.iter().rev().collect()
    }

    /// Whether something new in `parent` falls under the mutation.
    fn is_mutated_child(&self, parent: u64) -> bool {
        let Some((_, inside)) = &self.mutation else {
            return false;
        };
        self.inode(parent).is_ok_and(|p| p.mutated) || self.path_of(parent) == *inside
    }

    fn mutation_applies(&self, ino: u64, mutation: Mutation) -> bool {
        self.mutation.as_ref().is_some_and(|(m, _)| *m == mutation)
            && self.inode(ino).is_ok_and(|inode| inode.mutated)
    }

    /// Creates a file or directory named `name` in `parent`.
    fn create(
        &mut self,
        parent: u64,
        name: &OsStr,
        kind: Kind,
        perm: u16,
        req: &Request,
    ) -> Result<FileAttr, Errno> {
        if self.entries(parent)?.contains_key(name) {
            return Err(Errno::EEXIST);
        }
        let ino = self.next_ino;
        self.next_ino += 1;
        let mutated = self.is_mutated_child(parent);
        let inode = Inode::new(kind, perm, req.uid(), req.gid(), mutated);
        let attr = inode.attr(ino);
        self.inodes.insert(ino, inode);
        self.entries_mut(parent)?.insert(name.to_owned(), ino);
        Ok(attr)
    }

    fn unlink(&mut self, parent: u64, name: &OsStr) -> Result<(), Errno> {
        let ino = self.child(parent, name)?;
        if matches!(self.inode(ino)?.kind, Kind::Dir { .. }) {
            return Err(Errno::EISDIR);
        }
        self.entries_mut(parent)?.remove(name);
        let inode = self.inode_mut(ino)?;
        inode.links = inode.links.saturating_sub(1);
        inode.ctime = SystemTime::now();
        Ok(())
    }

    fn rmdir(&mut self, parent: u64, name: &OsStr) -> Result<(), Errno> {
        let ino = self.child(parent, name)?;
        match &self.inode(ino)?.kind {
            Kind::Dir { current, .. } if current.is_empty() => {}
            Kind::Dir { .. } => return Err(Errno::ENOTEMPTY),
            Kind::File { .. } => return Err(Errno::ENOTDIR),
        }
        self.entries_mut(parent)?.remove(name);
        Ok(())
    }

    fn rename(
        &mut self,
        parent: u64,
        name: &OsStr,
        new_parent: u64,
        new_name: &OsStr,
        flags: RenameFlags,
    ) -> Result<(), Errno> {
        if !(flags - RenameFlags::RENAME_NOREPLACE).is_empty() {
            return Err(Errno::EINVAL);
        }
        let ino = self.child(parent, name)?;
        let moving_dir = matches!(self.inode(ino)?.kind, Kind::Dir { .. });
        self.entries(new_parent)?;
        if moving_dir {
            // Not into itself or below it.
            let mut dir = new_parent;
            loop {
                if dir == ino {
                    return Err(Errno::EINVAL);
                }
                match self.inode(dir)?.kind {
                    Kind::Dir { parent, .. } if dir != ROOT => dir = parent,
                    _ => break,
                }
            }
        }
        if let Ok(replaced) = self.child(new_parent, new_name) {
            if replaced == ino {
                return Ok(());
            }
            if flags.contains(RenameFlags::RENAME_NOREPLACE) {
                return Err(Errno::EEXIST);
            }
            match (&self.inode(replaced)?.kind, moving_dir) {
                (Kind::Dir { current, .. }, true) if current.is_empty() => {}
                (Kind::Dir { .. }, true) => return Err(Errno::ENOTEMPTY),
                (Kind::Dir { .. }, false) => return Err(Errno::EISDIR),
                (Kind::File { .. }, true) => return Err(Errno::ENOTDIR),
                (Kind::File { .. }, false) => {
                    let replaced = self.inode_mut(replaced)?;
                    replaced.links = replaced.links.saturating_sub(1);
                }
            }
        }
        self.entries_mut(parent)?.remove(name);
        self.entries_mut(new_parent)?
            .insert(new_name.to_owned(), ino);
        let inode = self.inode_mut(ino)?;
        inode.ctime = SystemTime::now();
        if let Kind::Dir { parent, .. } = &mut inode.kind {
            *parent = new_parent;
        }
        Ok(())
    }

    fn link(&mut self, ino: u64, new_parent: u64, new_name: &OsStr) -> Result<FileAttr, Errno> {
        if matches!(self.inode(ino)?.kind, Kind::Dir { .. }) {
            return Err(Errno::EPERM);
        }
        if self.entries(new_parent)?.contains_key(new_name) {
            return Err(Errno::EEXIST);
        }
        self.entries_mut(new_parent)?
            .insert(new_name.to_owned(), ino);
        let inode = self.inode_mut(ino)?;
        inode.links += 1;
        inode.ctime = SystemTime::now();
        Ok(inode.attr(ino))
    }

    fn data_mut(&mut self, ino: u64) -> Result<&mut Vec<u8>, Errno> {
        let inode = self.inode_mut(ino)?;
        let now = SystemTime::now();
        inode.mtime = now;
        inode.ctime = now;
        match &mut inode.kind {
            Kind::File { current, .. } => Ok(Arc::make_mut(current)),
            Kind::Dir { .. } => Err(Errno::EISDIR),
        }
    }

    fn write(&mut self, ino: u64, offset: u64, data: &[u8]) -> Result<u32, Errno> {
        let offset = usize::try_from(offset).map_err(|_| Errno::EFBIG)?;
        let end = offset.checked_add(data.len()).ok_or(Errno::EFBIG)?;
        let file = self.data_mut(ino)?;
        if file.len() < end {
            file.resize(end, 0);
        }
        file[offset..end].copy_from_slice(data);
        u32::try_from(data.len()).map_err(|_| Errno::EINVAL)
    }

    fn read(&self, ino: u64, offset: u64, size: u32) -> Result<&[u8], Errno> {
        match &self.inode(ino)?.kind {
            Kind::File { current, .. } => {
                let start = usize::try_from(offset)
                    .unwrap_or(usize::MAX)
                    .min(current.len());
                let end = start.saturating_add(size as usize).min(current.len());
                Ok(&current[start..end])
            }
            Kind::Dir { .. } => Err(Errno::EISDIR),
        }
    }

    /// An fsync or fdatasync of a file, or an fsync of a directory: what it holds now
    /// becomes durable, unless the mutation says otherwise.
    fn sync(&mut self, ino: u64) -> Result<(), Errno> {
        let is_dir = matches!(self.inode(ino)?.kind, Kind::Dir { .. });
        let ignored = if is_dir {
            Mutation::IgnoreDirSyncs
        } else {
            Mutation::IgnoreFileSyncs
        };
        if self.mutation_applies(ino, ignored) {
            return Ok(());
        }
        match &mut self.inode_mut(ino)?.kind {
            Kind::File { current, durable } => *durable = current.clone(),
            Kind::Dir {
                current, durable, ..
            } => *durable = current.clone(),
        }
        Ok(())
    }

    /// The power cut: what is durable becomes current; inodes that no durable entry
    /// reaches from the root are gone.
    fn discard_volatile(&mut self) {
        let mut links: HashMap<u64, u32> = HashMap::from([(ROOT, 1)]);
        let mut parents: HashMap<u64, u64> = HashMap::from([(ROOT, ROOT)]);
        let mut dirs = vec![ROOT];
        let mut seen_dirs = HashSet::from([ROOT]);
        while let Some(dir) = dirs.pop() {
            let Some(Inode {
                kind: Kind::Dir { durable, .. },
                ..
            }) = self.inodes.get(&dir)
            else {
                continue;
            };
            let mut kept = durable.clone();
            kept.retain(|_, child| match self.inodes.get(child).map(|c| &c.kind) {
                Some(Kind::Dir { .. }) => {
                    // A directory is kept where it is first found (see the module comment).
                    if !seen_dirs.insert(*child) {
                        return false;
                    }
                    parents.insert(*child, dir);
                    links.insert(*child, 1);
                    dirs.push(*child);
                    true
                }
                Some(Kind::File { .. }) => {
                    *links.entry(*child).or_insert(0) += 1;
                    true
                }
                None => false,
            });
            if let Some(Inode {
                kind: Kind::Dir { durable, .. },
                ..
            }) = self.inodes.get_mut(&dir)
            {
                *durable = kept;
            }
        }
        self.inodes.retain(|ino, _| links.contains_key(ino));
        for (ino, inode) in &mut self.inodes {
            inode.links = links[ino];
            match &mut inode.kind {
                Kind::File { current, durable } => *current = durable.clone(),
                Kind::Dir {
                    parent,
                    current,
                    durable,
                } => {
                    *current = durable.clone();
                    *parent = parents[ino];
                }
            }
        }
        self.listings.clear();
    }
}

fn new_dir(parent: u64) -> Kind {
    Kind::Dir {
        parent,
        current: BTreeMap::new(),
        durable: BTreeMap::new(),
    }
}

fn new_file() -> Kind {
    let empty = Arc::new(Vec::new());
    Kind::File {
        current: empty.clone(),
        durable: empty,
    }
}

impl Inode {
    fn new(kind: Kind, perm: u16, uid: u32, gid: u32, mutated: bool) -> Inode {
        let now = SystemTime::now();
        Inode {
            kind,
            perm,
            uid,
            gid,
            atime: now,
            mtime: now,
            ctime: now,
            links: 1,
            mutated,
        }
    }

    fn attr(&self, ino: u64) -> FileAttr {
        let (kind, size, nlink) = match &self.kind {
            Kind::File { current, .. } => (FileType::RegularFile, current.len() as u64, self.links),
            Kind::Dir { .. } => (FileType::Directory, 0, 2),
        };
        FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: self.atime,
            mtime: self.mtime,
            ctime: self.ctime,
            crtime: self.ctime,
            kind,
            perm: self.perm,
            nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }
}

fn file_type(kind: &Kind) -> FileType {
    match kind {
        Kind::File { .. } => FileType::RegularFile,
        Kind::Dir { .. } => FileType::Directory,
    }
}

fn permissions(mode: u32, umask: u32) -> u16 {
    (mode & !umask & 0o7777) as u16
}

/// One mount's view of the shared state: the FUSE session owns it.
struct Mount {
    state: Arc<Mutex<State>>,
    generation: u64,
}

impl Mount {
    /// The state, unless a power cut came after this mount.
    fn state(&self) -> Result<MutexGuard<'_, State>, Errno> {
        let state = lock(&self.state);
        if state.generation == self.generation {
            Ok(state)
        } else {
            Err(Errno::EIO)
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> Result<T, Errno>) -> Result<T, Errno> {
        f(&mut *self.state()?)
    }
}

/// Answers a request whose reply carries nothing but success or an error.
fn answer(reply: ReplyEmpty, result: Result<(), Errno>) {
    match result {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

impl fuser::Filesystem for Mount {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.with(|s| {
            let ino = s.child(parent.0, name)?;
            Ok(s.inode(ino)?.attr(ino))
        }) {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.with(|s| Ok(s.inode(ino.0)?.attr(ino.0))) {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let result = self.with(|s| {
            if let Some(size) = size {
                let size = usize::try_from(size).map_err(|_| Errno::EFBIG)?;
                s.data_mut(ino.0)?.resize(size, 0);
            }
            let inode = s.inode_mut(ino.0)?;
            let time = |t: TimeOrNow| match t {
                TimeOrNow::SpecificTime(t) => t,
                TimeOrNow::Now => SystemTime::now(),
            };
            if let Some(mode) = mode {
                inode.perm = permissions(mode, 0);
            }
            inode.uid = uid.unwrap_or(inode.uid);
            inode.gid = gid.unwrap_or(inode.gid);
            inode.atime = atime.map_or(inode.atime, time);
            inode.mtime = mtime.map_or(inode.mtime, time);
            inode.ctime = SystemTime::now();
            Ok(inode.attr(ino.0))
        });
        match result {
            Ok(attr) => reply.attr(&TTL, &attr),
            Err(e) => reply.error(e),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        if mode & S_IFMT != S_IFREG {
            return reply.error(Errno::EPERM);
        }
        match self.with(|s| s.create(parent.0, name, new_file(), permissions(mode, umask), req)) {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let made = self.with(|s| {
            s.create(
                parent.0,
                name,
                new_dir(parent.0),
                permissions(mode, umask),
                req,
            )
        });
        match made {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        answer(reply, self.with(|s| s.unlink(parent.0, name)))
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        answer(reply, self.with(|s| s.rmdir(parent.0, name)))
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        answer(
            reply,
            self.with(|s| s.rename(parent.0, name, newparent.0, newname, flags)),
        )
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        match self.with(|s| s.link(ino.0, newparent.0, newname)) {
            Ok(attr) => reply.entry(&TTL, &attr, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.with(|s| s.inode(ino.0).map(|_| ())) {
            Ok(()) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.state() {
            Ok(state) => match state.read(ino.0, offset, size) {
                Ok(data) => reply.data(data),
                Err(e) => reply.error(e),
            },
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.with(|s| s.write(ino.0, offset, data)) {
            Ok(written) => reply.written(written),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // Closing a file makes nothing durable.
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        answer(
            reply,
            self.with(|s| {
                s.fsync_requests += 1;
                s.sync(ino.0)
            }),
        )
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let opened = self.with(|s| {
            let parent = match &s.inode(ino.0)?.kind {
                Kind::Dir { parent, .. } => *parent,
                Kind::File { .. } => return Err(Errno::ENOTDIR),
            };
            let mut listing = vec![
                (ino.0, FileType::Directory, OsString::from(".")),
                (parent, FileType::Directory, OsString::from("..")),
            ];
            for (name, child) in s.entries(ino.0)? {
                listing.push((*child, file_type(&s.inode(*child)?.kind), name.clone()));
            }
            let handle = s.next_handle;
            s.next_handle += 1;
            s.listings.insert(handle, listing);
            Ok(handle)
        });
        match opened {
            Ok(handle) => reply.opened(FileHandle(handle), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let state = match self.state() {
            Ok(state) => state,
            Err(e) => return reply.error(e),
        };
        let Some(listing) = state.listings.get(&fh.0) else {
            return reply.error(Errno::EBADF);
        };
        for (index, (ino, kind, name)) in listing.iter().enumerate().skip(offset as usize) {
            // The offset of an entry is where the next read starts.
            if reply.add(INodeNo(*ino), index as u64 + 1, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        if let Ok(mut state) = self.state() {
            state.listings.remove(&fh.0);
        }
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        answer(
            reply,
            self.with(|s| {
                s.fsyncdir_requests += 1;
                s.sync(ino.0)
            }),
        )
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        // Plenty of room: the data lives in memory and the tests write little.
        reply.statfs(1 << 24, 1 << 24, 1 << 24, 1 << 20, 1 << 20, 4096, 255, 4096);
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        reply.ok();
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        match self.with(|s| s.create(parent.0, name, new_file(), permissions(mode, umask), req)) {
            Ok(attr) => reply.created(
                &TTL,
                &attr,
                Generation(0),
                FileHandle(0),
                FopenFlags::empty(),
            ),
            Err(e) => reply.error(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::{self, File, OpenOptions};
    use std::io::Write;

    /// A mounted file system over a temporary mountpoint, unmounted before the
    /// mountpoint is removed (fields drop in order).
    struct Mounted {
        fs: PowerLossFs,
        _mountpoint: tempfile::TempDir,
    }

    impl std::ops::Deref for Mounted {
        type Target = PowerLossFs;
        fn deref(&self) -> &PowerLossFs {
            &self.fs
        }
    }

    impl std::ops::DerefMut for Mounted {
        fn deref_mut(&mut self) -> &mut PowerLossFs {
            &mut self.fs
        }
    }

    fn mounted(mutation: Option<(Mutation, &str)>) -> Mounted {
        let mountpoint = tempfile::tempdir().unwrap();
        let fs = match mutation {
            None => PowerLossFs::mount(mountpoint.path()),
            Some((mutation, inside)) => {
                PowerLossFs::mount_mutated(mountpoint.path(), mutation, Path::new(inside))
            }
        }
        .unwrap_or_else(|e| panic!("{e}"));
        Mounted {
            fs,
            _mountpoint: mountpoint,
        }
    }

    fn sync_dir(path: &Path) {
        File::open(path).unwrap().sync_all().unwrap();
    }

    /// Creates `name` holding `data`, its data fdatasync'd and its directory synced.
    fn durable_file(fs: &PowerLossFs, name: &str, data: &[u8]) {
        let mut file = File::create(fs.path().join(name)).unwrap();
        file.write_all(data).unwrap();
        file.sync_data().unwrap();
        sync_dir(fs.path().join(name).parent().unwrap());
    }

    #[test]
    fn a_write_without_a_sync_is_lost_and_one_with_fdatasync_is_kept() {
        let mut fs = mounted(None);
        durable_file(&fs, "kept", b"");
        durable_file(&fs, "lost", b"");
        for name in ["kept", "lost"] {
            let mut file = OpenOptions::new()
                .write(true)
                .open(fs.path().join(name))
                .unwrap();
            file.write_all(b"hello").unwrap();
            if name == "kept" {
                file.sync_data().unwrap();
            }
        }
        assert_eq!(fs::read(fs.path().join("lost")).unwrap(), b"hello");
        fs.cut_power().unwrap();
        assert_eq!(fs::read(fs.path().join("kept")).unwrap(), b"hello");
        assert_eq!(fs::read(fs.path().join("lost")).unwrap(), b"");
    }

    #[test]
    fn what_was_written_after_the_last_sync_is_lost() {
        let mut fs = mounted(None);
        durable_file(&fs, "f", b"first");
        let mut file = OpenOptions::new()
            .append(true)
            .open(fs.path().join("f"))
            .unwrap();
        file.write_all(b" second").unwrap();
        drop(file);
        // A truncation is a change of the data too.
        durable_file(&fs, "g", b"long content");
        File::options()
            .write(true)
            .open(fs.path().join("g"))
            .unwrap()
            .set_len(2)
            .unwrap();
        fs.cut_power().unwrap();
        assert_eq!(fs::read(fs.path().join("f")).unwrap(), b"first");
        assert_eq!(fs::read(fs.path().join("g")).unwrap(), b"long content");
    }

    #[test]
    fn a_new_file_without_a_directory_sync_is_gone_even_if_fdatasynced() {
        let mut fs = mounted(None);
        let mut file = File::create(fs.path().join("new")).unwrap();
        file.write_all(b"data").unwrap();
        file.sync_all().unwrap();
        drop(file);
        fs::create_dir(fs.path().join("d")).unwrap();
        durable_file(&fs, "d/inner", b"data"); // synced in `d`, but `d` itself is not
        fs.cut_power().unwrap();
        assert!(!fs.path().join("new").exists());
        assert!(!fs.path().join("d").exists());
    }

    #[test]
    fn a_directory_sync_keeps_new_entries_and_an_unsynced_unlink_is_undone() {
        let mut fs = mounted(None);
        fs::create_dir(fs.path().join("d")).unwrap();
        sync_dir(fs.path());
        durable_file(&fs, "d/inner", b"data");
        durable_file(&fs, "gone", b"x");
        durable_file(&fs, "back", b"y");
        fs::remove_file(fs.path().join("gone")).unwrap();
        sync_dir(fs.path());
        fs::remove_file(fs.path().join("back")).unwrap();
        fs.cut_power().unwrap();
        assert_eq!(fs::read(fs.path().join("d/inner")).unwrap(), b"data");
        assert!(!fs.path().join("gone").exists());
        assert_eq!(fs::read(fs.path().join("back")).unwrap(), b"y");
    }

    #[test]
    fn a_rename_without_a_directory_sync_is_reverted_and_one_with_it_is_kept() {
        let mut fs = mounted(None);
        durable_file(&fs, "a", b"old a");
        durable_file(&fs, "b", b"old b");
        durable_file(&fs, "c", b"c");
        fs::create_dir(fs.path().join("d")).unwrap();
        sync_dir(fs.path());
        // Replaces `b` (as a temporary file renamed over an object does), unsynced.
        fs::rename(fs.path().join("a"), fs.path().join("b")).unwrap();
        // Moves `c` into `d` and syncs both directories.
        fs::rename(fs.path().join("c"), fs.path().join("d/c")).unwrap();
        sync_dir(&fs.path().join("d"));
        assert_eq!(fs::read(fs.path().join("b")).unwrap(), b"old a");
        fs.cut_power().unwrap();
        assert_eq!(fs::read(fs.path().join("a")).unwrap(), b"old a");
        assert_eq!(fs::read(fs.path().join("b")).unwrap(), b"old b");
        // Only `d` was synced, so `c` is in both: the move's removal never became durable.
        assert_eq!(fs::read(fs.path().join("d/c")).unwrap(), b"c");
        assert_eq!(fs::read(fs.path().join("c")).unwrap(), b"c");

        fs::rename(fs.path().join("a"), fs.path().join("b")).unwrap();
        sync_dir(fs.path());
        fs.cut_power().unwrap();
        assert!(!fs.path().join("a").exists());
        assert_eq!(fs::read(fs.path().join("b")).unwrap(), b"old a");
    }

    #[test]
    fn a_directory_sync_reaches_the_file_system_as_fsyncdir_and_a_file_sync_as_fsync() {
        let fs = mounted(None);
        sync_dir(fs.path());
        assert_eq!(fs.sync_requests(), (0, 1));
        let file = File::create(fs.path().join("f")).unwrap();
        file.sync_data().unwrap();
        file.sync_all().unwrap();
        assert_eq!(fs.sync_requests(), (2, 1));
    }

    #[test]
    fn ignored_file_syncs_lose_data_inside_the_mutated_directory_only() {
        let mut fs = mounted(Some((Mutation::IgnoreFileSyncs, "m")));
        fs::create_dir_all(fs.path().join("m/sub")).unwrap();
        sync_dir(fs.path());
        sync_dir(&fs.path().join("m"));
        durable_file(&fs, "m/sub/f", b"data");
        durable_file(&fs, "outside", b"data");
        fs.cut_power().unwrap();
        assert_eq!(fs::read(fs.path().join("m/sub/f")).unwrap(), b"");
        assert_eq!(fs::read(fs.path().join("outside")).unwrap(), b"data");
    }

    #[test]
    fn ignored_directory_syncs_lose_entries_inside_the_mutated_directory_only() {
        let mut fs = mounted(Some((Mutation::IgnoreDirSyncs, "m")));
        fs::create_dir_all(fs.path().join("m/sub")).unwrap();
        sync_dir(fs.path());
        sync_dir(&fs.path().join("m"));
        durable_file(&fs, "m/f", b"data");
        durable_file(&fs, "m/sub/f", b"data");
        durable_file(&fs, "outside", b"data");
        fs.cut_power().unwrap();
        // `m` is not inside itself: its syncs count, and keep `m/f` and `m/sub`.
        assert_eq!(fs::read(fs.path().join("m/f")).unwrap(), b"data");
        assert!(fs.path().join("m/sub").is_dir());
        assert!(!fs.path().join("m/sub/f").exists());
        assert_eq!(fs::read(fs.path().join("outside")).unwrap(), b"data");
    }

    #[test]
    fn the_mount_is_listed_while_mounted_and_across_a_cut_and_gone_when_dropped() {
        let mountpoint = tempfile::tempdir().unwrap();
        let canonical = mountpoint.path().canonicalize().unwrap();
        assert!(!is_mount_point(&canonical).unwrap());
        let mut fs = PowerLossFs::mount(mountpoint.path()).unwrap_or_else(|e| panic!("{e}"));
        assert!(is_mount_point(&canonical).unwrap());
        fs.cut_power().unwrap();
        assert!(is_mount_point(&canonical).unwrap());
        drop(fs);
        assert!(!is_mount_point(&canonical).unwrap());
        // The kernel escapes a space as \040 and a backslash as \134.
        assert_eq!(
            unescape_mountinfo(br"/tmp/a\040b\134c\9"),
            b"/tmp/a b\\c\\9"
        );
    }

    #[test]
    fn a_listing_sees_every_entry_once_while_entries_are_removed() {
        let fs = mounted(None);
        // More entries than one kernel readdir request carries.
        for n in 0..500 {
            File::create(fs.path().join(format!("file-with-a-long-name-{n:04}"))).unwrap();
        }
        let mut seen = 0;
        for entry in fs::read_dir(fs.path()).unwrap() {
            fs::remove_file(entry.unwrap().path()).unwrap();
            seen += 1;
        }
        assert_eq!(seen, 500);
        assert_eq!(fs::read_dir(fs.path()).unwrap().count(), 0);
    }
}

//! The embedded default `ObjectStore`: one file per object under a root directory.
//!
//! A new object is written straight to its final name, then the file and its directory
//! are fsync'd. The WAL writer prepares the files of its next chunks ahead of time (empty
//! files whose directory entries are already durable), so a chunk's put writes into one
//! of those and costs a single fdatasync; creating a file is often the slowest part of
//! a small durable write. Empty files are never objects (every object has a footer), so
//! prepared files are invisible and an earlier process's are removed on open.
//!
//! Deleted files are recycled rather than unlinked: emptied, moved to a spare pool
//! (`.recycled/`), and linked in as the next prepared files. On ext4 without a journal
//! every new inode is found by skipping each inode freed in the last half minute, so at
//! thousands of chunks a second, creating and deleting a file apiece cost about a
//! millisecond of kernel CPU per chunk; reusing inodes frees none. A new process adopts
//! the pool its predecessor left, rather than freeing it all at once.
//!
//! The WAL's small chunks written by `put_prepared_blocking` skip all that while they
//! can: they are appended to the chunk log (`wal/.log/`, see [`ChunkLog`]), log files
//! made ahead of time, where a put changes no metadata at all. The files above are for
//! everything else, and for chunks that come while the log has no file ready.
//!
//! A crash during a put can leave a torn file behind, so every file ends with a footer
//! (length, CRC-32, magic) and a file whose footer does not check out reads as absent:
//! its put never returned, so it was never acknowledged. Replacing an existing object
//! goes through a temporary file and a rename, so readers never see a mix of old and new.

use std::collections::{BTreeSet, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, OnceLock};

use parking_lot::Mutex;

use async_trait::async_trait;
use bytes::Bytes;

use super::chunk_log::{BlockBuffer, ChunkLog};
use super::objects::ObjectStore;
use crate::error::{Error, Result};

/// Temporary files carry this suffix until they are renamed into place.
const TEMP_SUFFIX: &str = ".partial";
/// Footer: u64 data length, u32 CRC-32 of the object's key then its data, 4-byte magic;
/// big-endian. It sits at the very end of the file, after zero padding that rounds the
/// file up to whole blocks. The key is in the CRC because a file can come back from a
/// crash holding another object: a recycled file's emptying is not made durable, so a
/// prepared file whose put never came may show, footer and all, the bytes of the object
/// it held before (say an unacknowledged chunk of an earlier epoch, whose positions were
/// given to other records since, which recovery would refuse as an inconsistent log).
/// With the key checked it reads as absent, like a torn write.
const FOOTER_LEN: usize = 16;
const FOOTER_MAGIC: &[u8; 4] = b"SGO2";
/// The footer of files written before the key was checked: a CRC of the data alone.
const FOOTER_MAGIC_DATA_ONLY: &[u8; 4] = b"SGO1";
/// Files are written in whole blocks of this size, so that they can bypass the page cache.
pub(super) const BLOCK: usize = 4096;
/// The directory (under the root) of emptied files kept for reuse. No key can name it:
/// no part of a key starts with a dot.
const RECYCLED_DIR: &str = ".recycled";
/// The folder whose small blocking puts (the WAL writer's chunks) go to the chunk log
/// (see [`ChunkLog`]), and the log's directory: inside it, so that the log is where the
/// WAL's chunks are for anything that looks at that folder.
const CHUNK_LOG_FOLDER: &str = "wal/";
const CHUNK_LOG_DIR: &str = "wal/.log";
/// Spare files kept at most; a delete beyond that unlinks. Compaction deletes the chunks
/// of a whole interval (30 s by default) at once, which at a high rate of small appends
/// is tens of thousands; an empty inode costs a few hundred bytes of disk.
const MAX_RECYCLED: usize = 65_536;

/// A file image: `data`, zero padding, footer; block-aligned in memory and in length.
struct FileImage(BlockBuffer);

impl FileImage {
    /// The image of `data` as the object `key`.
    fn new(key: &str, data: &[u8]) -> Self {
        let len = (data.len() + FOOTER_LEN).div_ceil(BLOCK) * BLOCK;
        // Filled by appending, so only the padding is zeroed (not the whole image first).
        let mut image = BlockBuffer::with_capacity(len);
        image.extend(data);
        image.pad_to(len - FOOTER_LEN);
        image.extend(&(data.len() as u64).to_be_bytes());
        image.extend(&object_crc(key, data).to_be_bytes());
        image.extend(FOOTER_MAGIC);
        debug_assert_eq!(image.len(), len);
        Self(image)
    }

    fn bytes(&self) -> &[u8] {
        self.0.bytes()
    }
}

/// The data length a footer declares, if the footer is intact.
fn footer_data_len(footer: &[u8], file_len: u64) -> Option<u64> {
    let len = u64::from_be_bytes(footer[..8].try_into().ok()?);
    let magic = &footer[12..];
    ((magic == FOOTER_MAGIC || magic == FOOTER_MAGIC_DATA_ONLY)
        && len + FOOTER_LEN as u64 <= file_len)
        .then_some(len)
}

/// The CRC a footer carries for `data` as the object `key`.
fn object_crc(key: &str, data: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(key.as_bytes());
    hasher.update(data);
    hasher.finalize()
}

/// The data of a whole file of the object `key`, or `None` if its footer shows a torn
/// write or another object.
fn strip_footer(key: &str, mut file: Vec<u8>) -> Option<Vec<u8>> {
    let footer = &file[file.len().checked_sub(FOOTER_LEN)?..];
    let len = footer_data_len(footer, file.len() as u64)? as usize;
    let crc = u32::from_be_bytes(footer[8..12].try_into().unwrap());
    let expected = if &footer[12..] == FOOTER_MAGIC {
        object_crc(key, &file[..len])
    } else {
        crc32fast::hash(&file[..len])
    };
    if expected != crc {
        return None;
    }
    file.truncate(len);
    Some(file)
}

/// Which file a put writes its image to.
#[derive(Clone, Copy, PartialEq)]
enum Target {
    /// A file created by this put.
    New,
    /// A prepared file: it must exist and still be empty.
    Prepared,
}

/// Writes `image` to the `target` file at `path`, bypassing the page cache where the
/// file system allows (the kernel's copy into the cache was half the server's CPU time
/// under heavy appends); elsewhere through the cache.
fn write_image(path: &Path, image: &FileImage, target: Target) -> std::io::Result<File> {
    #[cfg(target_os = "linux")]
    match open_target(path, target, true) {
        Ok(mut file) => match file.write_all(image.bytes()) {
            Ok(()) => return Ok(file),
            // The file system refused direct I/O before writing anything.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                drop(file);
                if target == Target::New {
                    fs::remove_file(path)?;
                }
            }
            Err(e) => return Err(e),
        },
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
        Err(e) => return Err(e),
    }
    let mut file = open_target(path, target, false)?;
    file.write_all(image.bytes())?;
    Ok(file)
}

/// Opens the `target` file for writing; a prepared file that is no longer empty is
/// `AlreadyExists`.
fn open_target(path: &Path, target: Target, direct: bool) -> std::io::Result<File> {
    let mut options = OpenOptions::new();
    options.write(true).create_new(target == Target::New);
    #[cfg(target_os = "linux")]
    if direct {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_DIRECT);
    }
    #[cfg(not(target_os = "linux"))]
    let _ = direct;
    let file = options.open(path)?;
    if target == Target::Prepared && file.metadata()?.len() != 0 {
        return Err(std::io::ErrorKind::AlreadyExists.into());
    }
    Ok(file)
}

#[derive(Clone)]
pub struct LocalDirObjectStore {
    root: PathBuf,
    /// Makes temporary file names unique within this process.
    temp_counter: Arc<AtomicU64>,
    /// Prepared files whose directory entries are durable, not put yet.
    prepared: Arc<Mutex<HashSet<PathBuf>>>,
    /// The thread that prepares files, started by the first `prepare`.
    preparer: Arc<OnceLock<mpsc::Sender<PrepareRequest>>>,
    /// Emptied files to reuse.
    spares: Arc<Spares>,
    /// Where small blocking puts go while it has room.
    log: Arc<ChunkLog>,
    /// WAL chunks put into files that were not prepared (too large for the chunk log,
    /// or written alongside others), since the preparer last looked: while there are
    /// such, it prepares files even though the log has room.
    unprepared_chunk_puts: Arc<AtomicU64>,
}

/// The pool of emptied files (under `.recycled/`) that prepares reuse.
struct Spares {
    dir: PathBuf,
    /// The spares' names (numbers) in `dir`.
    files: Mutex<Vec<u64>>,
    /// Makes spare file names unique within this process.
    counter: AtomicU64,
}

impl Spares {
    /// Empties the object file at `path` and moves it into the pool, or unlinks it when
    /// the pool is full. Emptied first: an empty file is never an object, so a crash
    /// before the move leaves nothing readable behind (and the next open removes it).
    fn take_in(&self, path: &Path) -> std::io::Result<()> {
        if self.files.lock().len() >= MAX_RECYCLED {
            return fs::remove_file(path);
        }
        OpenOptions::new().write(true).open(path)?.set_len(0)?;
        let number = self.counter.fetch_add(1, Ordering::Relaxed);
        fs::rename(path, self.dir.join(number.to_string()))?;
        self.files.lock().push(number);
        Ok(())
    }

    /// Gives a spare file the name `path`, if one is left: a hard link then an unlink of
    /// the spare's name, so no inode is allocated or freed. `Ok(false)` when there is no
    /// usable spare (the caller creates a file instead); `AlreadyExists` when `path` does.
    fn give_out(&self, path: &Path) -> std::io::Result<bool> {
        let Some(number) = self.files.lock().pop() else {
            return Ok(false);
        };
        let spare = self.dir.join(number.to_string());
        match fs::hard_link(&spare, path) {
            Ok(()) => {
                // Should the spare's name stay, it is only a second name of an object
                // that is never handed out again, and the next open removes it.
                let _ = fs::remove_file(&spare);
                Ok(true)
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                self.files.lock().push(number);
                Err(e)
            }
            // A spare that cannot be linked (removed behind this process's back, say) is
            // dropped rather than offered again, so the pool cannot wedge prepares.
            Err(_) => {
                let _ = fs::remove_file(&spare);
                Ok(false)
            }
        }
    }
}

/// Files to prepare, and where to report the outcome.
type PrepareRequest = (Vec<PathBuf>, tokio::sync::oneshot::Sender<Result<()>>);

impl LocalDirObjectStore {
    /// Opens (creating if needed) a store rooted at `root`, and clears the temporary and
    /// prepared files an earlier process left.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self> {
        let root = root.into();
        open_dir_durably(&root).map_err(|e| io_error(&root, e))?;
        remove_leftovers(&root)?;
        let spares_dir = root.join(RECYCLED_DIR);
        let spares = adopt_spares(&spares_dir).map_err(|e| io_error(&spares_dir, e))?;
        let next_spare = spares.iter().max().map_or(0, |n| n + 1);
        let log_dir = root.join(CHUNK_LOG_DIR);
        let log = ChunkLog::open(log_dir.clone()).map_err(|e| io_error(&log_dir, e))?;
        Ok(Self {
            log: Arc::new(log),
            unprepared_chunk_puts: Arc::default(),
            root,
            temp_counter: Arc::new(AtomicU64::new(0)),
            prepared: Arc::default(),
            preparer: Arc::default(),
            spares: Arc::new(Spares {
                dir: spares_dir,
                files: Mutex::new(spares),
                counter: AtomicU64::new(next_spare),
            }),
        })
    }

    fn path_of(&self, key: &str) -> Result<PathBuf> {
        if key.is_empty()
            || key.starts_with('/')
            || key
                .split('/')
                .any(|part| part.is_empty() || part.starts_with('.'))
            || key.ends_with(TEMP_SUFFIX)
        {
            return Err(Error::storage(format!("invalid object key `{key}`")));
        }
        Ok(self.root.join(key))
    }

    /// Puts `data` as the object `key`, whose file is at `path`; a record of the key in
    /// the chunk log is deleted for good once the file is durable (reads look for the
    /// file first, so the new object is what they see at every step).
    fn put_blocking(&self, key: &str, path: &Path, data: &[u8]) -> Result<()> {
        self.put_file_blocking(key, path, data)?;
        if self.log.delete(key) {
            self.log.sync_deletes().map_err(|e| io_error(path, e))?;
        }
        Ok(())
    }

    fn put_file_blocking(&self, key: &str, path: &Path, data: &[u8]) -> Result<()> {
        let image = FileImage::new(key, data);
        if self.prepared.lock().remove(path) {
            // Its directory entry is durable already: one fdatasync makes the data durable.
            match write_image(path, &image, Target::Prepared) {
                Ok(file) => return file.sync_data().map_err(|e| io_error(path, e)),
                // Deleted, or written by another put meanwhile: the general path decides.
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::NotFound | std::io::ErrorKind::AlreadyExists
                    ) => {}
                Err(e) => return Err(io_error(path, e)),
            }
        } else if key.starts_with(CHUNK_LOG_FOLDER) {
            self.unprepared_chunk_puts.fetch_add(1, Ordering::Relaxed);
        }
        let dir = path.parent().expect("object paths have a parent");
        create_dir_all_durably(dir).map_err(|e| io_error(dir, e))?;
        // A new file; else an empty one still being prepared, written in place (its
        // directory entry may not be durable yet, so the directory is fsync'd as for a
        // new file); else an object, replaced.
        let written = match write_image(path, &image, Target::New) {
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                write_image(path, &image, Target::Prepared)
            }
            written => written,
        };
        match written {
            Ok(file) => {
                let result = file.sync_data().and_then(|()| File::open(dir)?.sync_all());
                if result.is_err() {
                    let _ = fs::remove_file(path);
                }
                result.map_err(|e| io_error(path, e))
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                self.replace_blocking(dir, path, &image)
            }
            Err(e) => {
                let _ = fs::remove_file(path);
                Err(io_error(path, e))
            }
        }
    }

    /// Replaces an existing object atomically: temporary file, fsync, rename, fsync.
    fn replace_blocking(&self, dir: &Path, path: &Path, image: &FileImage) -> Result<()> {
        let n = self.temp_counter.fetch_add(1, Ordering::Relaxed);
        let temp = dir.join(format!(
            "{}.{}.{n}{TEMP_SUFFIX}",
            path.file_name().unwrap().to_string_lossy(),
            std::process::id()
        ));
        let result = (|| {
            let file = write_image(&temp, image, Target::New)?;
            file.sync_data()?;
            fs::rename(&temp, path)?;
            File::open(dir)?.sync_all()
        })();
        if result.is_err() {
            let _ = fs::remove_file(&temp);
        }
        result.map_err(|e| io_error(path, e))
    }
}

/// Creates empty files at `paths` and makes their directory entries durable, one fsync
/// per directory; then records them in `prepared`. A path that exists already is left
/// alone: it is put, or being put.
fn prepare_files(
    prepared: &Mutex<HashSet<PathBuf>>,
    spares: &Spares,
    paths: Vec<PathBuf>,
) -> Result<()> {
    let mut created = Vec::new();
    let mut dirs = BTreeSet::new();
    for path in paths {
        let dir = path.parent().expect("object paths have a parent");
        create_dir_all_durably(dir).map_err(|e| io_error(dir, e))?;
        let made = match spares.give_out(&path) {
            Ok(true) => Ok(()),
            Ok(false) => OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
                .map(drop),
            Err(e) => Err(e),
        };
        match made {
            Ok(()) => {
                dirs.insert(dir.to_owned());
                created.push(path);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io_error(&path, e)),
        }
    }
    for dir in dirs {
        File::open(&dir)
            .and_then(|f| f.sync_all())
            .map_err(|e| io_error(&dir, e))?;
    }
    // Checked before the lock is taken: this thread runs at a low priority, and a put
    // waiting for the lock while it is descheduled mid-syscall stalls the log (puts
    // spun in `sched_yield` for tenths of a millisecond). A file deleted between the
    // check and the mark leaves a stale mark, which is harmless: the put finds no file
    // and takes the general path.
    let created: Vec<PathBuf> = created.into_iter().filter(|path| path.exists()).collect();
    prepared.lock().extend(created);
    Ok(())
}

/// Starts the thread that prepares files. It runs at a lower priority (nice 10): creating
/// a file can take a millisecond of kernel CPU when no spare is left (ext4 without a
/// journal skips recently freed inodes one by one), and on two cores that must not delay
/// the puts it speeds up. It ends when the store is dropped.
fn start_preparer(store: LocalDirObjectStore) -> mpsc::Sender<PrepareRequest> {
    let (requests, received) = mpsc::channel::<PrepareRequest>();
    let spawned = std::thread::Builder::new()
        .name("prepare-files".into())
        .spawn(move || {
            #[cfg(target_os = "linux")]
            {
                // SAFETY: changes only this thread's nice value (a Linux thread id is a
                // process id to setpriority); if it fails the thread keeps the default.
                unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 10) };
            }
            let log_folder = store.root.join(CHUNK_LOG_FOLDER);
            for (paths, done) in received {
                // While the chunk log has room, the WAL's small chunks go there and need
                // no files; larger ones, if any came since the last request, still do.
                let logged = |path: &PathBuf| path.starts_with(&log_folder);
                let files_unneeded = store.log.has_room()
                    && paths.iter().all(logged)
                    && store.unprepared_chunk_puts.swap(0, Ordering::Relaxed) == 0;
                let mut outcome = match files_unneeded {
                    true => Ok(()),
                    false => prepare_files(&store.prepared, &store.spares, paths),
                };
                if let Err(e) = store.log.replenish() {
                    outcome = outcome.and(Err(io_error(store.log.dir(), e)));
                }
                let _ = done.send(outcome);
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "could not start the file preparer; puts create their files");
    }
    requests
}

#[async_trait]
impl ObjectStore for LocalDirObjectStore {
    async fn put(&self, key: &str, data: Bytes) -> Result<()> {
        let path = self.path_of(key)?;
        let this = self.clone();
        let key = key.to_owned();
        tokio::task::spawn_blocking(move || this.put_blocking(&key, &path, &data))
            .await
            .map_err(|e| Error::internal("a file task did not finish", e))?
    }

    async fn get(&self, key: &str) -> Result<Option<Bytes>> {
        let path = self.path_of(key)?;
        let key = key.to_owned();
        let log = self.log.clone();
        tokio::task::spawn_blocking(move || {
            let read = || -> std::io::Result<Option<Vec<u8>>> {
                let mut file = File::open(&path)?;
                let opened = file.metadata()?;
                let mut data = Vec::with_capacity(opened.len() as usize);
                file.read_to_end(&mut data)?;
                Ok(still_named(&opened, &path)?.then_some(data))
            };
            let from_file = match read() {
                Ok(data) => data.and_then(|data| strip_footer(&key, data)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => return Err(io_error(&path, e)),
            };
            // No file holds it (a prepared file is empty): the chunk log may.
            match from_file {
                Some(data) => Ok(Some(Bytes::from(data))),
                None => log
                    .read(&key)
                    .map(|data| data.map(Bytes::from))
                    .map_err(|e| io_error(&path, e)),
            }
        })
        .await
        .map_err(|e| Error::internal("a file task did not finish", e))?
    }

    async fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes> {
        let path = self.path_of(key)?;
        let key = key.to_owned();
        let log = self.log.clone();
        tokio::task::spawn_blocking(move || {
            match read_range(&path, range.clone()) {
                // No file holds it (a prepared file is empty): the chunk log may.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    let data = log.read(&key).map_err(|e| io_error(&path, e))?;
                    let len = data.as_ref().map(|data| data.len() as u64);
                    check_range(&range, len).map_err(|e| io_error(&path, e))?;
                    let data = Bytes::from(data.expect("checked: the range lies in it"));
                    Ok(data.slice(range.start as usize..range.end as usize))
                }
                read => read.map_err(|e| io_error(&path, e)),
            }
        })
        .await
        .map_err(|e| Error::internal("a file task did not finish", e))?
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>> {
        let root = self.root.clone();
        let prefix = prefix.to_owned();
        let log = self.log.clone();
        tokio::task::spawn_blocking(move || {
            let mut keys = log.keys(&prefix);
            collect_keys(&root, "", &prefix, &mut keys)?;
            keys.sort();
            // A key in the log and in a file (a log append failed, then the put made
            // the file) is one object.
            keys.dedup();
            Ok(keys)
        })
        .await
        .map_err(|e| Error::internal("a file task did not finish", e))?
    }

    async fn delete(&self, key: &str) -> Result<()> {
        let path = self.path_of(key)?;
        let prepared = self.prepared.clone();
        let spares = self.spares.clone();
        let log = self.log.clone();
        let key = key.to_owned();
        tokio::task::spawn_blocking(move || {
            log.delete(&key);
            let removed = match spares.take_in(&path) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(io_error(&path, e)),
            };
            // After the unlink, so that a `prepare` of this key that finished before
            // it leaves no mark. One still under way may mark it afterwards: its put
            // then finds no file and takes the general path.
            prepared.lock().remove(&path);
            removed
        })
        .await
        .map_err(|e| Error::internal("a file task did not finish", e))?
    }

    /// One fsync per directory the keys are in: an unlink is durable once its
    /// directory is synced; and the chunk log's deletions.
    async fn sync_deletes(&self, keys: &[String]) -> Result<()> {
        let mut dirs = BTreeSet::new();
        for key in keys {
            let path = self.path_of(key)?;
            dirs.insert(
                path.parent()
                    .expect("object paths have a parent")
                    .to_owned(),
            );
        }
        let log = self.log.clone();
        let log_dir = self.root.join(CHUNK_LOG_DIR);
        tokio::task::spawn_blocking(move || {
            log.sync_deletes().map_err(|e| io_error(&log_dir, e))?;
            dirs.into_iter().try_for_each(|dir| match File::open(&dir) {
                Ok(handle) => handle.sync_all().map_err(|e| io_error(&dir, e)),
                // The directory is gone (an empty one removed): nothing in it to sync.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(io_error(&dir, e)),
            })
        })
        .await
        .map_err(|e| Error::internal("a file task did not finish", e))?
    }

    fn describe(&self) -> String {
        format!("local directory {}", self.root.display())
    }

    /// Appends to the chunk log while it has room; else writes into the key's prepared
    /// file.
    fn put_prepared_blocking(&self, key: &str, data: &[u8]) -> Option<Result<()>> {
        let path = self.path_of(key).ok()?;
        if key.starts_with(CHUNK_LOG_FOLDER) {
            if let Some(appended) = self.log.append(key, data) {
                return Some(appended.map_err(|e| io_error(&path, e)));
            }
        }
        // Should another put take the mark first, this one takes the general path.
        if !self.prepared.lock().contains(&path) {
            return None;
        }
        Some(self.put_blocking(key, &path, data))
    }

    async fn prepare(&self, keys: &[String]) -> Result<()> {
        let paths = keys
            .iter()
            .map(|key| self.path_of(key))
            .collect::<Result<Vec<_>>>()?;
        let preparer = self.preparer.get_or_init(|| start_preparer(self.clone()));
        let stopped = || Error::storage("the file preparer thread is not running");
        let (done, outcome) = tokio::sync::oneshot::channel();
        preparer.send((paths, done)).map_err(|_| stopped())?;
        outcome.await.map_err(|_| stopped())?
    }
}

/// Creates `dir` and any missing ancestors, fsyncing the parent of each one it creates:
/// a new directory's entry is durable only once its parent is synced, and without that a
/// power cut can take a new directory away with every object acknowledged inside it
/// (fsyncing the files and the directory itself is not enough). Costs nothing when `dir`
/// exists.
pub fn create_dir_all_durably(dir: &Path) -> std::io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        create_dir_all_durably(parent)?;
    }
    match fs::create_dir(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    sync_parent_of(dir)
}

/// Like `create_dir_all_durably`, and syncs `dir`'s parent even when `dir` exists: at
/// start-up, an earlier process may have created it and died before that sync.
pub fn open_dir_durably(dir: &Path) -> std::io::Result<()> {
    create_dir_all_durably(dir)?;
    sync_parent_of(dir)
}

/// Fsyncs the directory holding `dir` (`.` for a relative path's first component; the
/// root has none).
fn sync_parent_of(dir: &Path) -> std::io::Result<()> {
    match dir.parent() {
        Some(parent) if parent.as_os_str().is_empty() => File::open(".")?.sync_all(),
        Some(parent) => File::open(parent)?.sync_all(),
        None => Ok(()),
    }
}

fn collect_keys(dir: &Path, rel: &str, prefix: &str, keys: &mut Vec<String>) -> Result<()> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_error(dir, e)),
    };
    for entry in entries {
        let entry = entry.map_err(|e| io_error(dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let key = if rel.is_empty() {
            name.clone()
        } else {
            format!("{rel}/{name}")
        };
        // No key names the spare pool or the chunk log (no part of a key starts with
        // a dot); the log's keys are listed from its index.
        if name.starts_with('.') {
            continue;
        }
        let file_type = entry.file_type().map_err(|e| io_error(&entry.path(), e))?;
        if file_type.is_dir() {
            // Only descend where the prefix can still match.
            let dir_key = format!("{key}/");
            if dir_key.starts_with(prefix) || prefix.starts_with(&dir_key) {
                collect_keys(&entry.path(), &key, prefix, keys)?;
            }
        } else if !name.ends_with(TEMP_SUFFIX)
            && key.starts_with(prefix)
            && file_len(&entry)?.is_some_and(|len| len > 0)
        {
            keys.push(key);
        }
    }
    Ok(())
}

/// The length of a directory entry's file, `None` if it was removed meanwhile. Objects
/// are never empty; prepared files are.
fn file_len(entry: &fs::DirEntry) -> Result<Option<u64>> {
    match entry.metadata() {
        Ok(metadata) => Ok(Some(metadata.len())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_error(&entry.path(), e)),
    }
}

/// Takes an earlier process's spare files into the pool (creating the pool's directory
/// if need be): their numbers. Adopting them, rather than deleting them, spares the next
/// minutes' new files the cost of skipping thousands of freshly freed inodes (see the
/// module's docs). Only a file that is nothing but a spare is kept: one whose inode has
/// another name (a crash between linking it in as a prepared file and unlinking its
/// spare name) is an object's or a prepared file's, and only its spare name goes.
fn adopt_spares(dir: &Path) -> std::io::Result<Vec<u64>> {
    match fs::create_dir(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    let mut adopted = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        let metadata = fs::symlink_metadata(&path)?;
        let number = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u64>().ok());
        match number {
            Some(number) if is_only_a_spare(&metadata) && adopted.len() < MAX_RECYCLED => {
                if metadata.len() != 0 {
                    OpenOptions::new().write(true).open(&path)?.set_len(0)?;
                }
                adopted.push(number);
            }
            _ if metadata.is_dir() => fs::remove_dir_all(&path)?,
            _ => fs::remove_file(&path)?,
        }
    }
    Ok(adopted)
}

/// Whether a file in the spare pool has no name but its spare name.
fn is_only_a_spare(metadata: &fs::Metadata) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        metadata.is_file() && metadata.nlink() == 1
    }
    // Without link counts a spare name cannot be told from an object's second name:
    // none is adopted.
    #[cfg(not(unix))]
    {
        let _ = metadata;
        false
    }
}

/// Removes temporary files and prepared files, none of which is an object (the spare
/// pool's files are empty too, and are left to it).
fn remove_leftovers(dir: &Path) -> Result<()> {
    for entry in fs::read_dir(dir).map_err(|e| io_error(dir, e))? {
        let entry = entry.map_err(|e| io_error(dir, e))?;
        let path = entry.path();
        // The spare pool and the chunk log look after their own files.
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        if entry.file_type().map_err(|e| io_error(&path, e))?.is_dir() {
            remove_leftovers(&path)?;
        } else if path.to_string_lossy().ends_with(TEMP_SUFFIX) || file_len(&entry)? == Some(0) {
            fs::remove_file(&path).map_err(|e| io_error(&path, e))?;
        }
    }
    Ok(())
}

/// Ranges at least this long are read around the page cache where the file system
/// allows: they are read by catch-ups and read-ahead, once, and copying them through the
/// cache cost more CPU than the read itself; shorter ones go through it (their file's
/// footer block stays cached for the next).
const MIN_DIRECT_READ: u64 = 128 << 10;

/// The bytes at `range` of the data of the file at `path`.
fn read_range(path: &Path, range: Range<u64>) -> std::io::Result<Bytes> {
    #[cfg(target_os = "linux")]
    if range.end.saturating_sub(range.start) >= MIN_DIRECT_READ {
        match read_range_direct(path, range.clone()) {
            Ok(Some(bytes)) => return Ok(bytes),
            Ok(None) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
            Err(e) => return Err(e),
        }
    }
    read_range_buffered(path, range)
}

/// `range` read through the page cache.
fn read_range_buffered(path: &Path, range: Range<u64>) -> std::io::Result<Bytes> {
    let mut file = File::open(path)?;
    let opened = file.metadata()?;
    let file_len = opened.len();
    if file_len == 0 {
        // A prepared file, not an object.
        return Err(std::io::ErrorKind::NotFound.into());
    }
    let mut footer = [0u8; FOOTER_LEN];
    file.seek(SeekFrom::Start(file_len.saturating_sub(FOOTER_LEN as u64)))?;
    file.read_exact(&mut footer)?;
    check_range(&range, footer_data_len(&footer, file_len))?;
    let len = (range.end - range.start) as usize;
    let mut buf = Vec::with_capacity(len);
    append_exact_at(&file, &mut buf, len, range.start)?;
    if !still_named(&opened, path)? {
        return Err(std::io::ErrorKind::NotFound.into());
    }
    Ok(Bytes::from(buf))
}

/// Reads exactly `len` bytes at `offset` of `file` onto the end of `buf`, into its spare
/// capacity as it is, without zeroing it first: a catch-up read is bound by the CPU, and
/// zeroing buffers that the read then overwrites was about 6% of its CPU.
fn append_exact_at(file: &File, buf: &mut Vec<u8>, len: usize, offset: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    buf.reserve(len);
    let mut done = 0;
    while done < len {
        let spare = &mut buf.spare_capacity_mut()[..len - done];
        let at = libc::off_t::try_from(offset + done as u64)
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
        // SAFETY: `spare` is writable memory of `spare.len()` bytes owned by `buf`.
        let read =
            unsafe { libc::pread(file.as_raw_fd(), spare.as_mut_ptr().cast(), spare.len(), at) };
        match read {
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            read if read < 0 => {
                let err = std::io::Error::last_os_error();
                if err.kind() != std::io::ErrorKind::Interrupted {
                    return Err(err);
                }
            }
            read => {
                // SAFETY: the read initialized the `read` bytes that follow `buf`'s length.
                unsafe { buf.set_len(buf.len() + read as usize) };
                done += read as usize;
            }
        }
    }
    Ok(())
}

/// An error unless `range` lies within the data a footer declares (`None`: no intact
/// footer, so no data).
fn check_range(range: &Range<u64>, data_len: Option<u64>) -> std::io::Result<()> {
    let len = data_len.unwrap_or(0);
    if range.start > range.end || range.end > len {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("range {range:?} is outside the object's {len} bytes"),
        ));
    }
    Ok(())
}

/// `range` read with direct I/O, in whole blocks (files are written in whole blocks);
/// `None` where the file system refuses direct I/O or the file is not in whole blocks.
#[cfg(target_os = "linux")]
fn read_range_direct(path: &Path, range: Range<u64>) -> std::io::Result<Option<Bytes>> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
    {
        Ok(file) => file,
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return Ok(None),
        Err(e) => return Err(e),
    };
    let opened = file.metadata()?;
    let file_len = opened.len();
    let block = BLOCK as u64;
    if file_len < block || file_len % block != 0 {
        return Ok(None);
    }
    // Never past the footer (a damaged index, say), so the block arithmetic below stays
    // within the file.
    check_range(&range, Some(file_len - FOOTER_LEN as u64))?;
    // The blocks holding the range, and the last one (the footer) if they do not reach it.
    let first = range.start / block * block;
    let end = range
        .end
        .div_ceil(block)
        .saturating_mul(block)
        .min(file_len);
    let reaches_footer = end == file_len;
    let len = (end - first + if reaches_footer { 0 } else { block }) as usize;
    // Direct I/O reads into block-aligned memory: the blocks begin at the first aligned
    // byte of the buffer, which is allocated once with room for them (so it never moves).
    let mut buffer: Vec<u8> = Vec::with_capacity(len + BLOCK);
    let start = buffer.as_ptr().align_offset(BLOCK);
    buffer.resize(start, 0);
    let data_blocks = (end - first) as usize;
    append_exact_at(&file, &mut buffer, data_blocks, first)?;
    if !reaches_footer {
        append_exact_at(&file, &mut buffer, BLOCK, file_len - block)?;
    }
    check_range(
        &range,
        footer_data_len(&buffer[start + len - FOOTER_LEN..], file_len),
    )?;
    if !still_named(&opened, path)? {
        return Err(std::io::ErrorKind::NotFound.into());
    }
    let at = start + (range.start - first) as usize;
    Ok(Some(
        Bytes::from(buffer).slice(at..at + (range.end - range.start) as usize),
    ))
}

/// Whether `path` still names the file that was `opened` (its metadata, taken from the
/// open file). A file deleted while it was being read may have been recycled and
/// rewritten as another object by then: what was read is not the object at `path`,
/// which is gone.
fn still_named(opened: &fs::Metadata, path: &Path) -> std::io::Result<bool> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        match fs::metadata(path) {
            Ok(named) => Ok(named.ino() == opened.ino() && named.dev() == opened.dev()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }
    #[cfg(not(unix))]
    {
        let _ = (opened, path);
        Ok(true)
    }
}

fn io_error(path: &Path, err: std::io::Error) -> Error {
    Error::storage_caused(path.display().to_string(), err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn passes_the_object_store_conformance_suite() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalDirObjectStore::open(dir.path()).unwrap();
        super::super::objects::conformance(&store).await;
    }

    #[tokio::test]
    async fn leftover_temporary_files_are_invisible_and_cleared_on_open() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("wal")).unwrap();
        fs::write(dir.path().join("wal/chunk.1.0.partial"), b"torn").unwrap();
        let store = LocalDirObjectStore::open(dir.path()).unwrap();
        assert!(store.list("").await.unwrap().is_empty());
        assert!(!dir.path().join("wal/chunk.1.0.partial").exists());
    }

    /// Both ways a range is read (through the page cache, and around it where the file
    /// system takes direct I/O) give the object's bytes at any offsets: block-aligned or
    /// not, with the footer block read apart or as part of the range.
    #[tokio::test]
    async fn ranges_read_the_same_bytes_through_and_around_the_page_cache() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalDirObjectStore::open(dir.path()).unwrap();
        let data: Bytes = (0..(3 * BLOCK as u32 * 100 + 77))
            .map(|i| (i % 253) as u8)
            .collect();
        store.put("segments/big", data.clone()).await.unwrap();
        let path = dir.path().join("segments/big");
        let len = data.len() as u64;
        let ranges = [
            0..len,
            0..BLOCK as u64,
            1..BLOCK as u64 + 1,
            BLOCK as u64 * 7 + 13..len / 2 + 5,
            len - 200_000..len,
            len - 1..len,
            5..6,
        ];
        let expected = |r: &Range<u64>| data.slice(r.start as usize..r.end as usize);
        for range in &ranges {
            let buffered = read_range_buffered(&path, range.clone()).unwrap();
            assert!(buffered == expected(range), "buffered {range:?}");
            assert!(read_range(&path, range.clone()).unwrap() == expected(range));
        }
        #[cfg(target_os = "linux")]
        {
            use std::os::unix::fs::OpenOptionsExt;
            let takes_direct_io = OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECT)
                .open(&path)
                .is_ok();
            for range in &ranges {
                match read_range_direct(&path, range.clone()).unwrap() {
                    Some(direct) => assert!(direct == expected(range), "direct {range:?}"),
                    // Only where the file system refuses direct I/O (tmpfs before 6.6).
                    None => assert!(!takes_direct_io, "direct read refused for {range:?}"),
                }
            }
        }
        // Past the object's data: refused, both ways.
        assert!(read_range_buffered(&path, len - 10..len + 1).is_err());
        #[cfg(target_os = "linux")]
        assert!(read_range_direct(&path, len - 10..len + 1).is_err());
    }

    /// A file shorter than the read: an error, as `read_exact` gives, not a short buffer.
    #[test]
    fn a_read_past_the_end_of_a_file_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("short");
        fs::write(&path, b"0123456789").unwrap();
        let file = File::open(&path).unwrap();
        let mut buf = b"kept".to_vec();
        append_exact_at(&file, &mut buf, 6, 4).unwrap();
        assert_eq!(&buf[..], b"kept456789");
        let err = append_exact_at(&file, &mut buf, 3, 8).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof);
    }

    /// A store in a directory of its own, holding one object.
    async fn store_holding(
        key: &str,
        data: &'static [u8],
    ) -> (tempfile::TempDir, LocalDirObjectStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalDirObjectStore::open(dir.path()).unwrap();
        store.put(key, Bytes::from_static(data)).await.unwrap();
        (dir, store)
    }

    #[cfg(unix)]
    #[tokio::test]
    async fn deleted_files_are_reused_by_prepares_and_never_read_as_their_old_key() {
        use std::os::unix::fs::MetadataExt;
        let (dir, store) = store_holding("chunks/1", b"first").await;
        let inode = fs::metadata(dir.path().join("chunks/1")).unwrap().ino();
        // A reader that opened the file before the delete.
        let early_reader = File::open(dir.path().join("chunks/1")).unwrap();
        store.delete("chunks/1").await.unwrap();
        store.sync_deletes(&["chunks/1".into()]).await.unwrap();
        assert_eq!(store.get("chunks/1").await.unwrap(), None);
        store.prepare(&["chunks/2".into()]).await.unwrap();
        assert_eq!(
            fs::metadata(dir.path().join("chunks/2")).unwrap().ino(),
            inode,
            "the prepare reused the deleted file"
        );
        store
            .put("chunks/2", Bytes::from_static(b"second"))
            .await
            .unwrap();
        assert_eq!(
            store.get("chunks/2").await.unwrap().unwrap(),
            &b"second"[..]
        );
        // The early reader's file now holds another object: it is not `wal/1` any more.
        let opened = early_reader.metadata().unwrap();
        assert!(!still_named(&opened, &dir.path().join("chunks/1")).unwrap());
        assert_eq!(store.list("").await.unwrap(), vec!["chunks/2".to_string()]);
        // Spares are not objects, and a new process adopts them: its first prepare
        // reuses the file again. A spare name whose inode has another name (a crash
        // between linking a spare in and unlinking its spare name) is dropped instead.
        store.delete("chunks/2").await.unwrap();
        drop(store);
        fs::write(dir.path().join("chunks/3-object"), b"an object's bytes").unwrap();
        let linked_spare = dir.path().join(RECYCLED_DIR).join("77");
        fs::hard_link(dir.path().join("chunks/3-object"), &linked_spare).unwrap();
        let reopened = LocalDirObjectStore::open(dir.path()).unwrap();
        assert_eq!(
            reopened.list("chunks/2").await.unwrap(),
            Vec::<String>::new()
        );
        assert!(
            !linked_spare.exists(),
            "a spare with another name is dropped"
        );
        assert_eq!(
            fs::read_dir(dir.path().join(RECYCLED_DIR)).unwrap().count(),
            1
        );
        assert!(
            reopened.get(".recycled/0").await.is_err(),
            "no key names the pool"
        );
        reopened.prepare(&["chunks/4".into()]).await.unwrap();
        assert_eq!(
            fs::metadata(dir.path().join("chunks/4")).unwrap().ino(),
            inode,
            "the new process's prepare reused the file"
        );
        assert_eq!(
            fs::read(dir.path().join("chunks/3-object")).unwrap(),
            b"an object's bytes",
            "the other name's file is untouched"
        );
    }

    #[tokio::test]
    async fn a_spare_removed_from_under_the_pool_does_not_stop_prepares() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalDirObjectStore::open(dir.path()).unwrap();
        store
            .put("chunks/1", Bytes::from_static(b"one"))
            .await
            .unwrap();
        store.delete("chunks/1").await.unwrap();
        fs::remove_file(dir.path().join(RECYCLED_DIR).join("0")).unwrap();
        for key in ["chunks/2", "chunks/3"] {
            store.prepare(&[key.into()]).await.unwrap();
            assert!(dir.path().join(key).exists(), "{key} is prepared");
            store.put(key, Bytes::from_static(b"data")).await.unwrap();
        }
        assert_eq!(
            store.list("chunks/").await.unwrap(),
            ["chunks/2", "chunks/3"]
        );
    }

    #[tokio::test]
    async fn a_torn_object_reads_as_absent() {
        let (dir, store) = store_holding("wal/1", b"complete").await;
        let full = fs::read(dir.path().join("wal/1")).unwrap();
        for cut in [0, 1, full.len() / 2, full.len() - 1] {
            fs::write(dir.path().join("wal/2"), &full[..cut]).unwrap();
            assert_eq!(store.get("wal/2").await.unwrap(), None, "cut at {cut}");
        }
        let mut flipped = full.clone();
        flipped[0] ^= 1;
        fs::write(dir.path().join("wal/2"), &flipped).unwrap();
        assert_eq!(store.get("wal/2").await.unwrap(), None);
        // A put over a torn leftover replaces it.
        store
            .put("wal/2", Bytes::from_static(b"retried"))
            .await
            .unwrap();
        assert_eq!(
            store.get("wal/2").await.unwrap(),
            Some(Bytes::from_static(b"retried"))
        );
    }

    #[tokio::test]
    async fn a_file_holding_another_objects_bytes_reads_as_absent() {
        let (dir, store) = store_holding("wal/1/old", b"an older object").await;
        // What a crash can leave in a recycled file handed out as a prepared one.
        fs::copy(dir.path().join("wal/1/old"), dir.path().join("wal/1/new")).unwrap();
        assert_eq!(store.get("wal/1/new").await.unwrap(), None);
        assert_eq!(
            store.get("wal/1/old").await.unwrap(),
            Some(Bytes::from_static(b"an older object"))
        );
        // Files written before the key was in the footer still read.
        let data = b"written by an earlier version";
        let mut file = data.to_vec();
        file.resize(BLOCK - FOOTER_LEN, 0);
        file.extend_from_slice(&(data.len() as u64).to_be_bytes());
        file.extend_from_slice(&crc32fast::hash(data).to_be_bytes());
        file.extend_from_slice(FOOTER_MAGIC_DATA_ONLY);
        fs::write(dir.path().join("wal/1/earlier"), &file).unwrap();
        assert_eq!(
            store.get("wal/1/earlier").await.unwrap(),
            Some(Bytes::from_static(data))
        );
        assert_eq!(
            store.get_range("wal/1/earlier", 4..14).await.unwrap(),
            Bytes::from_static(b"ten by an ")
        );
    }

    #[tokio::test]
    async fn a_put_writes_into_its_prepared_file_and_leftovers_are_cleared_on_open() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let store = LocalDirObjectStore::open(dir.path()).unwrap();
        let keys: Vec<String> = (0..4).map(|n| format!("chunks/9/{n}")).collect();
        store.prepare(&keys).await.unwrap();
        let path = |key: &str| dir.path().join(key);
        let inode = |key: &str| fs::metadata(path(key)).unwrap().ino();
        let is_marked = |key: &str| store.prepared.lock().contains(&path(key));
        let prepared = inode("chunks/9/0");
        assert!(keys.iter().all(|key| is_marked(key)));
        assert!(store.list("").await.unwrap().is_empty());

        // The fast path: the mark is consumed and the prepared file written.
        store
            .put("chunks/9/0", Bytes::from_static(b"data"))
            .await
            .unwrap();
        assert!(!is_marked("chunks/9/0"), "the put took the prepared path");
        assert_eq!(inode("chunks/9/0"), prepared);
        assert_eq!(store.list("").await.unwrap(), vec!["chunks/9/0"]);
        // A second put of the same key replaces the object, as for any key.
        store
            .put("chunks/9/0", Bytes::from_static(b"again"))
            .await
            .unwrap();
        assert_eq!(
            store.get("chunks/9/0").await.unwrap(),
            Some(Bytes::from_static(b"again"))
        );

        // An empty file not marked prepared (a prepare still under way) is written in
        // place by the general path.
        fs::File::create(path("chunks/9/7")).unwrap();
        let unmarked = inode("chunks/9/7");
        store
            .put("chunks/9/7", Bytes::from_static(b"raced"))
            .await
            .unwrap();
        assert_eq!(inode("chunks/9/7"), unmarked);
        assert_eq!(
            store.get("chunks/9/7").await.unwrap(),
            Some(Bytes::from_static(b"raced"))
        );

        // A mark whose file is gone (a delete that raced the prepare, which may mark
        // after the delete's unmark) sends the put down the general path: it creates
        // the file and the object is there.
        fs::remove_file(path("chunks/9/3")).unwrap();
        assert!(is_marked("chunks/9/3"));
        store
            .put("chunks/9/3", Bytes::from_static(b"stale mark"))
            .await
            .unwrap();
        assert!(!is_marked("chunks/9/3"));
        assert_eq!(
            store.get("chunks/9/3").await.unwrap(),
            Some(Bytes::from_static(b"stale mark"))
        );

        drop(store);
        let store = LocalDirObjectStore::open(dir.path()).unwrap();
        assert!(!path("chunks/9/1").exists());
        assert!(!path("chunks/9/2").exists());
        assert_eq!(
            store.list("").await.unwrap(),
            vec!["chunks/9/0", "chunks/9/3", "chunks/9/7"]
        );
        // A key an earlier process prepared (its file removed on open) is created anew.
        store
            .put("chunks/9/1", Bytes::from_static(b"late"))
            .await
            .unwrap();
        assert_eq!(
            store.get("chunks/9/1").await.unwrap(),
            Some(Bytes::from_static(b"late"))
        );
    }

    #[tokio::test]
    async fn a_blocking_put_goes_to_the_chunk_log_and_reads_like_any_object() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalDirObjectStore::open(dir.path()).unwrap();
        // Before any prepare there is no log file and no prepared file: nothing done,
        // the caller puts the usual way.
        assert!(store.put_prepared_blocking("wal/5/0", b"data").is_none());
        assert!(store.put_prepared_blocking("../x", b"data").is_none());
        assert!(!dir.path().join("wal/5/0").exists());

        store.prepare(&["wal/5/0".into()]).await.unwrap();
        let put = store.put_prepared_blocking("wal/5/0", b"data");
        assert!(matches!(put, Some(Ok(()))), "{put:?}");
        store
            .put("wal/5/1", Bytes::from_static(b"a file"))
            .await
            .unwrap();
        // The chunk went into the log, not into a file of its own.
        assert_eq!(
            fs::metadata(dir.path().join("wal/5/0"))
                .map(|m| m.len())
                .ok(),
            Some(0)
        );
        assert_eq!(
            store.get("wal/5/0").await.unwrap(),
            Some(Bytes::from_static(b"data"))
        );
        assert_eq!(
            store.get_range("wal/5/0", 1..3).await.unwrap(),
            Bytes::from_static(b"at")
        );
        assert!(store.get_range("wal/5/0", 1..5).await.is_err());
        assert_eq!(store.list("wal/").await.unwrap(), ["wal/5/0", "wal/5/1"]);
        drop(store);

        let reopened = LocalDirObjectStore::open(dir.path()).unwrap();
        assert_eq!(reopened.list("wal/").await.unwrap(), ["wal/5/0", "wal/5/1"]);
        assert_eq!(
            reopened.get("wal/5/0").await.unwrap(),
            Some(Bytes::from_static(b"data"))
        );
        // A put of the same key the usual way replaces it.
        reopened
            .put("wal/5/0", Bytes::from_static(b"new"))
            .await
            .unwrap();
        assert_eq!(
            reopened.get("wal/5/0").await.unwrap(),
            Some(Bytes::from_static(b"new"))
        );
        reopened.delete("wal/5/0").await.unwrap();
        reopened.delete("wal/5/1").await.unwrap();
        reopened
            .sync_deletes(&["wal/5/0".into(), "wal/5/1".into()])
            .await
            .unwrap();
        assert_eq!(reopened.get("wal/5/0").await.unwrap(), None);
        drop(reopened);
        let reopened = LocalDirObjectStore::open(dir.path()).unwrap();
        assert_eq!(reopened.list("").await.unwrap(), Vec::<String>::new());
    }

    #[tokio::test]
    async fn with_the_chunk_log_full_a_blocking_put_writes_only_prepared_keys() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalDirObjectStore::open(dir.path()).unwrap();
        store.prepare(&["wal/5/0".into()]).await.unwrap();
        // Fill the log's files: records of 60 KiB, then of a block.
        let mut n = 100;
        for size in [60 << 10, 100] {
            loop {
                n += 1;
                let key = format!("wal/4/{n}");
                if store.put_prepared_blocking(&key, &vec![1; size]).is_none() {
                    break;
                }
            }
        }
        let put = store.put_prepared_blocking("wal/5/0", b"data");
        assert!(matches!(put, Some(Ok(()))), "{put:?}");
        assert!(!store.prepared.lock().contains(&dir.path().join("wal/5/0")));
        assert!(fs::metadata(dir.path().join("wal/5/0")).unwrap().len() > 0);
        assert_eq!(
            store.get("wal/5/0").await.unwrap(),
            Some(Bytes::from_static(b"data"))
        );
        // Not prepared: nothing done, the caller puts the usual way.
        assert!(store.put_prepared_blocking("wal/5/1", b"again").is_none());
        drop(store);
        let reopened = LocalDirObjectStore::open(dir.path()).unwrap();
        assert_eq!(
            reopened.get("wal/5/0").await.unwrap(),
            Some(Bytes::from_static(b"data"))
        );
    }

    #[tokio::test]
    async fn while_the_log_has_room_files_are_prepared_only_after_a_chunk_needed_one() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalDirObjectStore::open(dir.path()).unwrap();
        let prepared = |key: &str| store.prepared.lock().contains(&dir.path().join(key));
        // The first request finds no log file ready yet: it prepares files, and the log.
        store.prepare(&["wal/1/0".into()]).await.unwrap();
        assert!(prepared("wal/1/0"));
        // With the log ready, small chunks go there: no files.
        store.prepare(&["wal/1/1".into()]).await.unwrap();
        assert!(!prepared("wal/1/1"));
        // A chunk too large for the log was put into a file of its own, unprepared:
        // the next request prepares files again, and the one after it does not.
        store
            .put("wal/1/9", Bytes::from(vec![7; 512 << 10]))
            .await
            .unwrap();
        store.prepare(&["wal/1/2".into()]).await.unwrap();
        assert!(prepared("wal/1/2"));
        store.prepare(&["wal/1/3".into()]).await.unwrap();
        assert!(!prepared("wal/1/3"));
    }

    #[tokio::test]
    async fn keys_cannot_escape_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalDirObjectStore::open(dir.path()).unwrap();
        for key in ["../x", "/abs", "a//b", "a/./b", ""] {
            assert!(store.put(key, Bytes::new()).await.is_err(), "{key}");
        }
    }
}

//! The chunk log: the local directory's small objects put by `put_prepared_blocking` (the
//! WAL writer's chunks when nothing else is being written) are appended to log files
//! made ahead of time, rather than each written into a file of its own.
//!
//! Why: a file per chunk costs the disk three writes and a journal commit per put (the
//! data, the new size, the allocated block), and the server a file to prepare and later
//! to recycle. A write in place into a file whose blocks are all written already and
//! whose size is set changes no metadata: one device write, and an `fdatasync` that is
//! only the flush. Measured in the server (BENCHMARKS.md): one to fifty connections each
//! sending one XADD at a time made 25-40% more XADDs a second.
//!
//! Layout: `<log dir>/<id>`, each file [`LOG_BYTES`] long, filled with zeros and synced
//! when it is made. Block 0 holds the file's header (magic, generation, CRC). Records
//! follow from block 1, block-aligned, one after another: a 32-byte record header (magic,
//! generation, key and data lengths, a CRC of all of them with the key and the data),
//! the key, the data, zero padding to a whole block.
//!
//! **Recovery.** On open each file is read from its start. A record counts while its
//! magic, generation and CRC check out; the first that does not ends the file. Appends
//! are serial, each durable before the next starts, so nothing acknowledged lies past a
//! torn record. A tombstone (a record whose deletion was made durable) is stepped over.
//!
//! **Reuse.** A file whose records are all deleted is reused once its generation is
//! raised (its header rewritten and synced): that makes every record in it stale at once,
//! which is the durable form of deleting them all, and no record of an earlier use can
//! come back after a crash. Generations are unique across the files (one counter). A
//! deletion in a file that still holds other records is made durable by overwriting the
//! record's header with a tombstone's. Only the header's bytes are written (through the
//! page cache), so a write torn by a power cut leaves the header old or new, never a
//! block that is neither (which would end the file there, and hide the records after).

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use super::local_dir::{create_dir_all_durably, BLOCK};

/// One log file's size: 1,023 chunks of one block each.
pub(super) const LOG_BYTES: u64 = 4 << 20;
/// Larger objects go to files of their own. What the log saves is a fixed cost per put,
/// which matters for small ones; a fresh log file is written twice (zeros first), which
/// for large records would double what the disk writes. With 50 connections each
/// pipelining 64 XADDs (chunks of about 150 KiB), records up to a MiB made puts take
/// 1.4 ms against 0.8 ms in files.
const MAX_RECORD_BYTES: usize = 64 << 10;
/// Log files kept ready (empty, with a fresh generation) ahead of the one being written.
const READY_LOGS: usize = 2;
/// Emptied log files kept for reuse at most; beyond that they are removed.
const MAX_SPARE_LOGS: usize = 256;

const LOG_MAGIC: &[u8; 4] = b"SGLH";
const RECORD_MAGIC: &[u8; 4] = b"SGLR";
const TOMBSTONE_MAGIC: &[u8; 4] = b"SGLT";
const RECORD_HEADER: usize = 32;
/// Files being made carry this suffix until they are complete and renamed.
const PARTIAL_SUFFIX: &str = ".partial";

/// A buffer of whole blocks whose start is block-aligned in memory, as direct I/O needs.
pub(super) struct BlockBuffer {
    buffer: Vec<u8>,
    start: usize,
}

impl BlockBuffer {
    /// An empty buffer with room for `len` bytes (a multiple of the block size).
    pub fn with_capacity(len: usize) -> Self {
        // The allocation stays where it is while the vector is within its capacity.
        let mut buffer: Vec<u8> = Vec::with_capacity(len + BLOCK);
        let start = buffer.as_ptr().align_offset(BLOCK);
        buffer.resize(start, 0);
        Self { buffer, start }
    }

    pub fn extend(&mut self, bytes: &[u8]) {
        self.buffer.extend_from_slice(bytes);
    }

    /// Zeros up to `len` bytes from the start.
    pub fn pad_to(&mut self, len: usize) {
        self.buffer.resize(self.start + len, 0);
    }

    pub fn len(&self) -> usize {
        self.buffer.len() - self.start
    }

    pub fn bytes(&self) -> &[u8] {
        debug_assert!(self.buffer[self.start..].as_ptr().align_offset(BLOCK) == 0);
        &self.buffer[self.start..]
    }
}

/// Where a record is.
#[derive(Debug, Clone, Copy)]
struct Location {
    log: u64,
    offset: u64,
    key_len: u32,
    data_len: u32,
}

impl Location {
    fn record_len(&self) -> u64 {
        record_len(self.key_len as usize, self.data_len as usize) as u64
    }
}

/// The bytes a record of a key and data this long takes, in whole blocks.
fn record_len(key_len: usize, data_len: usize) -> usize {
    (RECORD_HEADER + key_len + data_len).div_ceil(BLOCK) * BLOCK
}

struct LogFile {
    handles: Arc<Handles>,
    generation: u64,
    /// Records in it not deleted.
    live: usize,
    /// Deleted records whose deletion is not durable yet.
    deleted: Vec<Location>,
}

/// A log file's open handles.
struct Handles {
    /// For writes, with `O_DIRECT` where the file system allows it, so that a write goes
    /// to the device without a copy into the page cache.
    direct: Option<File>,
    /// For reads, and for writes where direct I/O is refused.
    plain: File,
}

impl Handles {
    fn open(path: &Path) -> std::io::Result<Self> {
        let plain = OpenOptions::new().read(true).write(true).open(path)?;
        #[cfg(target_os = "linux")]
        let direct = {
            use std::os::unix::fs::OpenOptionsExt;
            match OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_DIRECT)
                .open(path)
            {
                Ok(file) => Some(file),
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => None,
                Err(e) => return Err(e),
            }
        };
        #[cfg(not(target_os = "linux"))]
        let direct = None;
        Ok(Self { direct, plain })
    }

    /// Writes `bytes` (whole, aligned blocks) at `offset`, without waiting for the disk.
    fn write(&self, bytes: &[u8], offset: u64) -> std::io::Result<()> {
        if let Some(direct) = &self.direct {
            match direct.write_all_at(bytes, offset) {
                // Opened, yet refused at the write: some file systems do that.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
                written => return written,
            }
        }
        self.plain.write_all_at(bytes, offset)
    }

    /// Writes `bytes` at `offset` and waits until they are durable.
    fn write_durably(&self, bytes: &[u8], offset: u64) -> std::io::Result<()> {
        self.write(bytes, offset)?;
        self.plain.sync_data()
    }
}

#[derive(Default)]
struct State {
    index: HashMap<String, Location>,
    logs: BTreeMap<u64, LogFile>,
    /// The file being appended to, and where its next record goes.
    active: Option<(u64, u64)>,
    /// Empty files with a fresh generation, next to be appended to.
    ready: Vec<u64>,
    next_generation: u64,
    next_id: u64,
}

impl State {
    /// Room for a record of `len` bytes: the file and offset, or `None` if no file has
    /// room (none is ready).
    fn reserve(&mut self, len: u64) -> Option<(u64, u64)> {
        if let Some((log, offset)) = self.active {
            if offset + len <= LOG_BYTES {
                self.active = Some((log, offset + len));
                return Some((log, offset));
            }
        }
        // The file being written is full (for this record): written no further.
        self.active = None;
        let log = self.ready.pop()?;
        self.active = Some((log, BLOCK as u64 + len));
        Some((log, BLOCK as u64))
    }

    /// Forgets `key`'s record (its deletion is made durable by `sync_deletes`).
    fn remove(&mut self, key: &str) -> bool {
        let Some(location) = self.index.remove(key) else {
            return false;
        };
        if let Some(log) = self.logs.get_mut(&location.log) {
            log.live -= 1;
            log.deleted.push(location);
        }
        crate::telemetry::wal_log_chunks(self.index.len());
        true
    }

    fn insert(&mut self, key: String, location: Location) {
        self.remove(&key);
        self.logs
            .get_mut(&location.log)
            .expect("a log in use stays")
            .live += 1;
        self.index.insert(key, location);
        crate::telemetry::wal_log_chunks(self.index.len());
    }
}

pub(super) struct ChunkLog {
    dir: PathBuf,
    state: Mutex<State>,
    /// Held across each append's write and sync: a record may be written only once the
    /// one before it is durable (recovery stops at the first torn record).
    appending: Mutex<()>,
    /// Held across `sync_deletes`, so that two never free the same file.
    syncing: Mutex<()>,
    /// Held across `replenish`.
    making: Mutex<()>,
}

impl ChunkLog {
    /// Opens the log in `dir` (which need not exist yet): reads every file's records
    /// into the index, removes files left half-made, and readies the files with no
    /// record left.
    pub fn open(dir: PathBuf) -> std::io::Result<Self> {
        let mut state = State::default();
        let mut empty = Vec::new();
        let entries = match fs::read_dir(&dir) {
            Ok(entries) => entries.collect::<std::io::Result<Vec<_>>>()?,
            Err(e) if e.kind() == ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e),
        };
        let mut scanned = Vec::new();
        for entry in entries {
            let path = entry.path();
            let id = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u64>().ok());
            // An entry may vanish once listed: the files of an earlier store on this
            // directory in the same process (a test reopening it) can still be in the
            // making on its preparer's thread, which renames or drops them.
            let vanished = |e: &std::io::Error| e.kind() == ErrorKind::NotFound;
            let Some(id) = id else {
                // A file half-made by an earlier process, or a stranger.
                match fs::remove_file(&path) {
                    Err(e) if !vanished(&e) => return Err(e),
                    _ => continue,
                }
            };
            let file = match File::open(&path) {
                Ok(file) => file,
                Err(e) if vanished(&e) => continue,
                Err(e) => return Err(e),
            };
            let (generation, records) = scan(&file)?;
            let generation = generation.unwrap_or(0);
            state.next_id = state.next_id.max(id + 1);
            state.next_generation = state.next_generation.max(generation + 1);
            let log = LogFile {
                handles: Arc::new(Handles::open(&path)?),
                generation,
                live: 0,
                deleted: Vec::new(),
            };
            state.logs.insert(id, log);
            scanned.push((generation, id, records));
        }
        // Oldest first, so that of a key written twice (a put retried) the later stands.
        scanned.sort_unstable_by_key(|(generation, _, _)| *generation);
        for (_, id, records) in scanned {
            for (key, offset, key_len, data_len) in records {
                let location = Location {
                    log: id,
                    offset,
                    key_len,
                    data_len,
                };
                state.insert(key, location);
            }
        }
        for (id, log) in &state.logs {
            if log.live == 0 {
                empty.push(*id);
            }
        }
        crate::telemetry::wal_log_chunks(state.index.len());
        let this = Self {
            dir,
            state: Mutex::new(state),
            appending: Mutex::new(()),
            syncing: Mutex::new(()),
            making: Mutex::new(()),
        };
        for id in empty {
            this.free(id)?;
        }
        Ok(this)
    }

    /// Appends `key`'s record and makes it durable. `None`, having done nothing, when the
    /// object is too large for the log or no file is ready (the caller writes a file).
    pub fn append(&self, key: &str, data: &[u8]) -> Option<std::io::Result<()>> {
        let len = record_len(key.len(), data.len());
        if len > MAX_RECORD_BYTES || key.len() > u16::MAX as usize {
            return None;
        }
        let _serial = self.appending.lock();
        let (log, offset, handles, generation) = {
            let mut state = self.state.lock();
            let (log, offset) = state.reserve(len as u64)?;
            let file = &state.logs[&log];
            (log, offset, file.handles.clone(), file.generation)
        };
        let image = record_image(generation, key, data);
        let written = handles.write_durably(image.bytes(), offset);
        let mut state = self.state.lock();
        match written {
            Ok(()) => {
                let location = Location {
                    log,
                    offset,
                    key_len: key.len() as u32,
                    data_len: data.len() as u32,
                };
                state.insert(key.to_owned(), location);
                Some(Ok(()))
            }
            Err(e) => {
                // Nothing may follow a record that may be torn: the file is written no
                // further, and freed once what it holds is deleted.
                if state.active.is_some_and(|(active, _)| active == log) {
                    state.active = None;
                }
                Some(Err(e))
            }
        }
    }

    /// `key`'s data: `None` if the log has no such record.
    pub fn read(&self, key: &str) -> std::io::Result<Option<Vec<u8>>> {
        let (location, handles, generation) = {
            let state = self.state.lock();
            let Some(location) = state.index.get(key).copied() else {
                return Ok(None);
            };
            let log = &state.logs[&location.log];
            (location, log.handles.clone(), log.generation)
        };
        let mut record = vec![0u8; location.record_len() as usize];
        handles.plain.read_exact_at(&mut record, location.offset)?;
        // Deleted and the file reused since the lookup: the record there is another's.
        Ok(match parse_record(&record, generation) {
            Some(Parsed::Live { key: found, data }) if found == key.as_bytes() => {
                Some(data.to_vec())
            }
            _ => None,
        })
    }

    /// The keys in the log that start with `prefix`.
    pub fn keys(&self, prefix: &str) -> Vec<String> {
        let state = self.state.lock();
        state
            .index
            .keys()
            .filter(|key| key.starts_with(prefix))
            .cloned()
            .collect()
    }

    /// Removes `key`'s record, if the log has one (whether it had); the removal is
    /// durable once `sync_deletes` has run.
    pub fn delete(&self, key: &str) -> bool {
        self.state.lock().remove(key)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Makes every deletion so far durable: a file with no record left gets a new
    /// generation (and is ready for reuse); in any other, each deleted record's header
    /// becomes a tombstone's.
    pub fn sync_deletes(&self) -> std::io::Result<()> {
        let _serial = self.syncing.lock();
        let mut emptied = Vec::new();
        let mut tombstones = Vec::new();
        {
            let state = self.state.lock();
            let active = state.active.map(|(log, _)| log);
            for (id, log) in &state.logs {
                // Written no further (neither being appended to nor ready) and empty: a
                // file filled, or one whose last append failed, whose records are gone.
                if log.live == 0 && active != Some(*id) && !state.ready.contains(id) {
                    emptied.push(*id);
                } else if !log.deleted.is_empty() {
                    tombstones.push((
                        *id,
                        log.handles.clone(),
                        log.generation,
                        log.deleted.clone(),
                    ));
                }
            }
        }
        for (id, handles, generation, deleted) in tombstones {
            for location in &deleted {
                let header = tombstone_header(generation, location);
                handles.plain.write_all_at(&header, location.offset)?;
            }
            handles.plain.sync_data()?;
            // Deletions since the copy was taken were added after these.
            if let Some(log) = self.state.lock().logs.get_mut(&id) {
                log.deleted.drain(..deleted.len());
            }
        }
        for id in emptied {
            self.free(id)?;
        }
        Ok(())
    }

    /// Whether an append may find room now (a file is being written, or one is ready).
    pub fn has_room(&self) -> bool {
        let state = self.state.lock();
        !state.ready.is_empty() || state.active.is_some()
    }

    /// Makes new files until [`READY_LOGS`] are ready: each filled with zeros, synced,
    /// then named, and its directory synced, before it is offered.
    pub fn replenish(&self) -> std::io::Result<()> {
        let _serial = self.making.lock();
        loop {
            let (id, generation) = {
                let mut state = self.state.lock();
                if state.ready.len() >= READY_LOGS {
                    return Ok(());
                }
                state.next_id += 1;
                state.next_generation += 1;
                (state.next_id - 1, state.next_generation - 1)
            };
            create_dir_all_durably(&self.dir)?;
            let path = self.dir.join(id.to_string());
            let partial = self.dir.join(format!("{id}{PARTIAL_SUFFIX}"));
            let mut image = vec![0u8; LOG_BYTES as usize];
            image[..BLOCK].copy_from_slice(log_header(generation).bytes());
            let mut file = File::create(&partial)?;
            file.write_all(&image)?;
            file.sync_all()?;
            drop(file);
            fs::rename(&partial, &path)?;
            File::open(&self.dir)?.sync_all()?;
            let log = LogFile {
                handles: Arc::new(Handles::open(&path)?),
                generation,
                live: 0,
                deleted: Vec::new(),
            };
            let mut state = self.state.lock();
            state.logs.insert(id, log);
            state.ready.push(id);
        }
    }

    /// Gives the emptied file `id` a new generation and makes it ready, or removes it
    /// when enough are ready already.
    fn free(&self, id: u64) -> std::io::Result<()> {
        let (handles, generation, spare) = {
            let mut state = self.state.lock();
            state.next_generation += 1;
            let generation = state.next_generation - 1;
            let spare = state.ready.len() < MAX_SPARE_LOGS;
            (state.logs[&id].handles.clone(), generation, spare)
        };
        if !spare {
            fs::remove_file(self.dir.join(id.to_string()))?;
            File::open(&self.dir)?.sync_all()?;
            self.state.lock().logs.remove(&id);
            return Ok(());
        }
        handles.write_durably(log_header(generation).bytes(), 0)?;
        let mut state = self.state.lock();
        let log = state.logs.get_mut(&id).expect("a log being freed stays");
        log.generation = generation;
        log.deleted.clear();
        state.ready.push(id);
        Ok(())
    }
}

fn log_header(generation: u64) -> BlockBuffer {
    let mut block = BlockBuffer::with_capacity(BLOCK);
    block.extend(LOG_MAGIC);
    block.extend(&generation.to_be_bytes());
    block.extend(&header_crc(LOG_MAGIC, generation, 0, 0).to_be_bytes());
    block.pad_to(BLOCK);
    block
}

fn record_image(generation: u64, key: &str, data: &[u8]) -> BlockBuffer {
    let len = record_len(key.len(), data.len());
    let mut image = BlockBuffer::with_capacity(len);
    let (key_len, data_len) = (key.len() as u32, data.len() as u32);
    let fields = header_fields(RECORD_MAGIC, generation, key_len, data_len);
    let mut crc = crc32fast::Hasher::new();
    crc.update(&fields);
    crc.update(key.as_bytes());
    crc.update(data);
    image.extend(&fields);
    image.extend(&crc.finalize().to_be_bytes());
    image.pad_to(RECORD_HEADER);
    image.extend(key.as_bytes());
    image.extend(data);
    image.pad_to(len);
    image
}

/// The header of a deleted record: how long the record is, and that it is deleted.
fn tombstone_header(generation: u64, location: &Location) -> [u8; RECORD_HEADER] {
    let (key_len, data_len) = (location.key_len, location.data_len);
    let mut header = [0u8; RECORD_HEADER];
    header[..20].copy_from_slice(&header_fields(
        TOMBSTONE_MAGIC,
        generation,
        key_len,
        data_len,
    ));
    let crc = header_crc(TOMBSTONE_MAGIC, generation, key_len, data_len);
    header[20..24].copy_from_slice(&crc.to_be_bytes());
    header
}

fn header_fields(magic: &[u8; 4], generation: u64, key_len: u32, data_len: u32) -> [u8; 20] {
    let mut fields = [0u8; 20];
    fields[..4].copy_from_slice(magic);
    fields[4..12].copy_from_slice(&generation.to_be_bytes());
    fields[12..16].copy_from_slice(&key_len.to_be_bytes());
    fields[16..20].copy_from_slice(&data_len.to_be_bytes());
    fields
}

fn header_crc(magic: &[u8; 4], generation: u64, key_len: u32, data_len: u32) -> u32 {
    crc32fast::hash(&header_fields(magic, generation, key_len, data_len))
}

enum Parsed<'a> {
    Live { key: &'a [u8], data: &'a [u8] },
    Tombstone,
}

/// The record at the start of `bytes`, if it is whole and of `generation`; its length
/// in whole blocks is `record_len` of its key and data lengths.
fn parse_record(bytes: &[u8], generation: u64) -> Option<Parsed<'_>> {
    let header = bytes.get(..RECORD_HEADER)?;
    let magic: &[u8; 4] = header[..4].try_into().ok()?;
    let found_generation = u64::from_be_bytes(header[4..12].try_into().ok()?);
    let key_len = u32::from_be_bytes(header[12..16].try_into().ok()?);
    let data_len = u32::from_be_bytes(header[16..20].try_into().ok()?);
    let crc = u32::from_be_bytes(header[20..24].try_into().ok()?);
    if found_generation != generation
        || record_len(key_len as usize, data_len as usize) > bytes.len()
    {
        return None;
    }
    if magic == TOMBSTONE_MAGIC {
        return (crc == header_crc(magic, generation, key_len, data_len))
            .then_some(Parsed::Tombstone);
    }
    if magic != RECORD_MAGIC {
        return None;
    }
    let key_end = RECORD_HEADER + key_len as usize;
    let (key, data) = (
        &bytes[RECORD_HEADER..key_end],
        &bytes[key_end..key_end + data_len as usize],
    );
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&header_fields(magic, generation, key_len, data_len));
    hasher.update(key);
    hasher.update(data);
    (hasher.finalize() == crc).then_some(Parsed::Live { key, data })
}

/// A log file's generation (`None`: its header is not whole) and its records, in order:
/// key, offset, key and data lengths. Reads only as far as the records go (a file ready
/// for reuse is read no further than its header and first block).
#[allow(clippy::type_complexity)]
fn scan(file: &File) -> std::io::Result<(Option<u64>, Vec<(String, u64, u32, u32)>)> {
    let mut window = Window {
        file,
        len: file.metadata()?.len() as usize,
        bytes: Vec::new(),
    };
    window.fill(BLOCK)?;
    let Some(header) = window.bytes.get(..16) else {
        return Ok((None, Vec::new()));
    };
    let generation = u64::from_be_bytes(header[4..12].try_into().unwrap());
    let crc = u32::from_be_bytes(header[12..16].try_into().unwrap());
    if &header[..4] != LOG_MAGIC || crc != header_crc(LOG_MAGIC, generation, 0, 0) {
        return Ok((None, Vec::new()));
    }
    let mut records = Vec::new();
    let mut offset = BLOCK;
    while offset + RECORD_HEADER <= window.len {
        window.fill(offset + RECORD_HEADER)?;
        let header = &window.bytes[offset..offset + RECORD_HEADER];
        let key_len = u32::from_be_bytes(header[12..16].try_into().unwrap()) as usize;
        let data_len = u32::from_be_bytes(header[16..20].try_into().unwrap()) as usize;
        let len = record_len(key_len, data_len);
        if len > window.len - offset {
            break;
        }
        window.fill(offset + len)?;
        match parse_record(&window.bytes[offset..offset + len], generation) {
            Some(Parsed::Live { key, .. }) => {
                let Ok(key) = std::str::from_utf8(key) else {
                    break;
                };
                records.push((
                    key.to_owned(),
                    offset as u64,
                    key_len as u32,
                    data_len as u32,
                ));
            }
            Some(Parsed::Tombstone) => {}
            None => break,
        }
        offset += len;
    }
    Ok((Some(generation), records))
}

/// The start of a file, read a MiB or more at a time as a scan needs it.
struct Window<'a> {
    file: &'a File,
    len: usize,
    bytes: Vec<u8>,
}

impl Window<'_> {
    /// Reads until the first `end` bytes (or the whole file, if shorter) are in.
    fn fill(&mut self, end: usize) -> std::io::Result<()> {
        let end = end.min(self.len);
        if self.bytes.len() >= end {
            return Ok(());
        }
        let from = self.bytes.len();
        let to = end.max(from + (1 << 20)).min(self.len);
        self.bytes.resize(to, 0);
        self.file
            .read_exact_at(&mut self.bytes[from..], from as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A log with its files made.
    fn ready_log(dir: &Path) -> ChunkLog {
        let log = ChunkLog::open(dir.to_owned()).unwrap();
        log.replenish().unwrap();
        log
    }

    fn append(log: &ChunkLog, key: &str, data: &[u8]) {
        let appended = log.append(key, data);
        assert!(matches!(appended, Some(Ok(()))), "{appended:?}");
    }

    fn read(log: &ChunkLog, key: &str) -> Option<Vec<u8>> {
        log.read(key).unwrap()
    }

    #[test]
    fn without_a_ready_file_or_for_a_large_object_an_append_does_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let log = ChunkLog::open(dir.path().join("log")).unwrap();
        assert!(!log.has_room());
        assert!(log.append("wal/1/0", b"data").is_none());
        log.replenish().unwrap();
        assert!(log.has_room());
        assert!(log.append("wal/1/0", &vec![7; MAX_RECORD_BYTES]).is_none());
        assert_eq!(log.keys(""), Vec::<String>::new());
    }

    #[test]
    fn records_survive_a_reopen_and_a_torn_record_ends_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let log = ready_log(dir.path());
        append(&log, "wal/1/0", b"zero");
        append(&log, "wal/1/1", &vec![1; 5000]);
        append(&log, "wal/1/2", b"two");
        assert_eq!(read(&log, "wal/1/1"), Some(vec![1; 5000]));
        assert_eq!(read(&log, "wal/1/9"), None);
        let mut keys = log.keys("wal/1/");
        keys.sort();
        assert_eq!(keys, ["wal/1/0", "wal/1/1", "wal/1/2"]);
        let (file, torn_at) = {
            let state = log.state.lock();
            let location = state.index["wal/1/1"];
            (
                dir.path().join(location.log.to_string()),
                location.offset + 4096 + 100,
            )
        };
        drop(log);

        let log = ChunkLog::open(dir.path().to_owned()).unwrap();
        assert_eq!(read(&log, "wal/1/0"), Some(b"zero".to_vec()));
        assert_eq!(read(&log, "wal/1/1"), Some(vec![1; 5000]));
        assert_eq!(read(&log, "wal/1/2"), Some(b"two".to_vec()));
        drop(log);

        // A write torn in the record's second block: it and everything after it are
        // gone, everything before it stays.
        let handle = OpenOptions::new().write(true).open(&file).unwrap();
        handle.write_all_at(b"torn", torn_at).unwrap();
        let log = ChunkLog::open(dir.path().to_owned()).unwrap();
        assert_eq!(read(&log, "wal/1/0"), Some(b"zero".to_vec()));
        assert_eq!(read(&log, "wal/1/1"), None);
        assert_eq!(read(&log, "wal/1/2"), None);
        assert_eq!(log.keys(""), ["wal/1/0"]);
    }

    #[test]
    fn a_synced_deletion_stays_deleted_and_the_records_after_it_stay() {
        let dir = tempfile::tempdir().unwrap();
        let log = ready_log(dir.path());
        for n in 0..4 {
            append(
                &log,
                &format!("wal/1/{n}"),
                format!("record {n}").as_bytes(),
            );
        }
        assert!(log.delete("wal/1/1"));
        assert!(!log.delete("wal/1/1"));
        assert_eq!(read(&log, "wal/1/1"), None);
        log.sync_deletes().unwrap();
        drop(log);

        let log = ChunkLog::open(dir.path().to_owned()).unwrap();
        let mut keys = log.keys("");
        keys.sort();
        assert_eq!(keys, ["wal/1/0", "wal/1/2", "wal/1/3"]);
        assert_eq!(read(&log, "wal/1/3"), Some(b"record 3".to_vec()));
        // Appends go on in a new file after a reopen, and find room.
        log.replenish().unwrap();
        append(&log, "wal/2/0", b"after");
        assert_eq!(read(&log, "wal/2/0"), Some(b"after".to_vec()));
    }

    #[test]
    fn an_emptied_file_is_reused_and_none_of_its_old_records_comes_back() {
        let dir = tempfile::tempdir().unwrap();
        let log = ready_log(dir.path());
        // 63 records of 60 KiB fill a file; the next starts another.
        let big = vec![3u8; 60 << 10];
        let per_file = (LOG_BYTES as usize - BLOCK) / record_len(7, big.len());
        for n in 0..=per_file {
            append(&log, &format!("wal/1/{n}"), &big);
        }
        let first_file = log.state.lock().index["wal/1/0"].log;
        let next_file = log.state.lock().index[&format!("wal/1/{per_file}")].log;
        assert_ne!(next_file, first_file);
        let old_generation = log.state.lock().logs[&first_file].generation;
        for n in 0..per_file {
            log.delete(&format!("wal/1/{n}"));
        }
        log.sync_deletes().unwrap();
        // The emptied file is ready again, with a new generation; fill the file being
        // written so that the next append reuses it, with one small record.
        let ready = log.state.lock().ready.clone();
        assert!(ready.contains(&first_file), "{ready:?}");
        let mut n = 1000;
        while log.state.lock().active.map(|(id, _)| id) != Some(first_file) {
            n += 1;
            append(&log, &format!("wal/1/{n}"), &big);
        }
        assert!(log.state.lock().logs[&first_file].generation > old_generation);
        let reused: Vec<String> = {
            let state = log.state.lock();
            state
                .index
                .iter()
                .filter(|(_, location)| location.log == first_file)
                .map(|(key, _)| key.clone())
                .collect()
        };
        assert_eq!(reused.len(), 1, "{reused:?}");
        let mut before = log.keys("");
        before.sort();
        drop(log);

        let log = ChunkLog::open(dir.path().to_owned()).unwrap();
        let mut after = log.keys("");
        after.sort();
        assert_eq!(after, before);
        for n in 0..per_file {
            assert_eq!(read(&log, &format!("wal/1/{n}")), None);
        }
        assert_eq!(read(&log, &reused[0]), Some(big.clone()));
    }
}

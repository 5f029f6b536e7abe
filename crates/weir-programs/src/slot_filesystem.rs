//! `wasi:filesystem/types` for processes, counted against their owner's
//! [`SlotQuota`]: wasmtime-wasi's own implementation does every operation,
//! and this layer in front of it reserves what an operation may grow
//! before it runs and gives back what a removal frees after it ran.
//!
//! Invariant owned here: no path through `wasi:filesystem` grows a slot
//! past its quota — a write at an offset, a write or append stream, a
//! size set, a file, directory or link made. A growth that does not fit
//! fails with `insufficient-space` and nothing of it is written.
//! Removals give back what they free: an unlinked file its bytes if it was
//! its last link, a file renamed over another the other's. A file whose
//! last link goes while the process holds it open still takes its bytes
//! on disk: they stay counted (and so does its growth) until nothing of
//! the process holds it, so "fill, unlink, keep open" does not escape the
//! quota. A process with no slot passes straight through (it has no
//! directory to write).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use wasmtime::component::{HasData, Linker, Resource};
use wasmtime_wasi::filesystem::{Descriptor, WasiFilesystemCtxView, WasiFilesystemView};
use wasmtime_wasi::p2::bindings::filesystem::types::{
    self, DescriptorType, ErrorCode, HostDescriptor, HostDirectoryEntryStream,
};
use wasmtime_wasi::p2::{
    DynOutputStream, FsError, FsResult, OutputStream, Pollable, StreamError, StreamResult,
};
use weir_runtime::code::HostInterfaces;
use weir_runtime::guest_state::GenerationState;

use crate::slot_quota::{ENTRY_BYTES, SlotQuota};

/// A process's claim on its owner's quota, kept in its store, with the
/// files it holds open.
pub struct SlotCharge {
    quota: Arc<SlotQuota>,
    files: Arc<Mutex<OpenFiles>>,
}

impl SlotCharge {
    pub fn new(quota: Arc<SlotQuota>) -> SlotCharge {
        SlotCharge {
            quota,
            files: Arc::default(),
        }
    }
}

/// The process is gone: what its unlinked files held is free on disk.
impl Drop for SlotCharge {
    fn drop(&mut self) {
        let orphans = std::mem::take(&mut lock(&self.files).orphans);
        for file in orphans {
            self.quota.release(file_bytes(&file));
        }
    }
}

/// A file's identity: wasi's metadata hash (its device and inode).
type Identity = (u64, u64);

/// The regular files a process holds open, by descriptor, and the files
/// whose last link it removed while it held them.
#[derive(Default)]
struct OpenFiles {
    open: HashMap<u32, (Identity, Arc<std::fs::File>)>,
    /// Still counted: each is given back once only this list holds it.
    orphans: Vec<Arc<std::fs::File>>,
}

impl OpenFiles {
    /// A handle on the open file `identity`, if the process holds one.
    fn held(&self, identity: Identity) -> Option<Arc<std::fs::File>> {
        self.open
            .values()
            .find(|(id, _)| *id == identity)
            .map(|(_, file)| file.clone())
    }

    /// Gives back what the orphans nothing else holds take (a descriptor
    /// or a stream of the process holds a handle each).
    fn settle(&mut self, quota: &SlotQuota) {
        self.orphans.retain(|file| {
            if Arc::strong_count(file) > 1 {
                return true;
            }
            quota.release(file_bytes(file));
            false
        });
    }

    fn is_orphan(&self, file: &Arc<std::fs::File>) -> bool {
        self.orphans.iter().any(|o| Arc::ptr_eq(o, file))
    }
}

fn lock(files: &Mutex<OpenFiles>) -> std::sync::MutexGuard<'_, OpenFiles> {
    files.lock().unwrap_or_else(|p| p.into_inner())
}

/// What a file takes now (an unreadable one: nothing more to give back).
fn file_bytes(file: &std::fs::File) -> u64 {
    file.metadata().map_or(0, |m| m.len())
}

/// The filesystem as a process sees it: wasmtime-wasi's, counted.
pub struct SlotFs<'a> {
    inner: WasiFilesystemCtxView<'a>,
    quota: Option<Arc<SlotQuota>>,
    files: Option<Arc<Mutex<OpenFiles>>>,
}

struct HasSlotFs;

impl HasData for HasSlotFs {
    type Data<'a> = SlotFs<'a>;
}

fn view(state: &mut GenerationState) -> SlotFs<'_> {
    let (quota, files) = match state.extension::<SlotCharge>() {
        Some(c) => (Some(c.quota.clone()), Some(c.files.clone())),
        None => (None, None),
    };
    SlotFs {
        inner: state.filesystem(),
        quota,
        files,
    }
}

/// Puts [`SlotFs`] in place of wasmtime-wasi's `wasi:filesystem/types`
/// in the programs' linker.
pub struct SlotFilesystem;

impl HostInterfaces for SlotFilesystem {
    fn add_to_linker(&self, linker: &mut Linker<GenerationState>) -> wasmtime::Result<()> {
        linker.allow_shadowing(true);
        types::add_to_linker::<GenerationState, HasSlotFs>(linker, view)?;
        linker.allow_shadowing(false);
        Ok(())
    }
}

/// A second handle to a descriptor the guest lent us.
fn again<T: 'static>(fd: &Resource<T>) -> Resource<T> {
    Resource::new_borrow(fd.rep())
}

fn full() -> FsError {
    ErrorCode::InsufficientSpace.into()
}

/// What removing an entry with `stat` frees: its entry, and its bytes if
/// it is a file's last link. (A file already unlinked but still open had
/// its bytes given back when its last link went; its later growth stays
/// counted until the owner's next measure.)
fn frees(stat: &types::DescriptorStat) -> u64 {
    let bytes = if stat.type_ == DescriptorType::RegularFile && stat.link_count == 1 {
        stat.size
    } else {
        0
    };
    ENTRY_BYTES + bytes
}

impl SlotFs<'_> {
    /// The identity of what is at `path` (not following a link).
    async fn identity_at(
        &mut self,
        dir: &Resource<types::Descriptor>,
        path: &str,
    ) -> Option<Identity> {
        HostDescriptor::metadata_hash_at(
            &mut self.inner,
            again(dir),
            types::PathFlags::empty(),
            path.to_string(),
        )
        .await
        .ok()
        .map(|h| (h.lower, h.upper))
    }

    /// What the last link of a file, `stat` before it went, frees: its
    /// entry, and its bytes unless the process holds it open (then it is
    /// an orphan, given back when nothing holds it).
    fn last_link_gone(&self, stat: &types::DescriptorStat, identity: Option<Identity>) -> u64 {
        let held = match (&self.files, identity) {
            (Some(files), Some(identity))
                if stat.type_ == DescriptorType::RegularFile && stat.link_count == 1 =>
            {
                let mut files = lock(files);
                let held = files.held(identity);
                if let Some(file) = &held {
                    files.orphans.push(file.clone());
                }
                held.is_some()
            }
            _ => false,
        };
        if held { ENTRY_BYTES } else { frees(stat) }
    }

    /// Remembers the regular file `fd` opens, with its identity.
    async fn track(&mut self, fd: &Resource<types::Descriptor>) {
        let Some(files) = self.files.clone() else {
            return;
        };
        let file = match self.inner.table.get(fd) {
            Ok(Descriptor::File(file)) => file.file.clone(),
            _ => return,
        };
        if let Ok(h) = HostDescriptor::metadata_hash(&mut self.inner, again(fd)).await {
            lock(&files)
                .open
                .insert(fd.rep(), ((h.lower, h.upper), file));
        }
    }

    /// Gives back what orphans nothing holds any more take.
    fn settle(&self) {
        if let (Some(files), Some(quota)) = (&self.files, &self.quota) {
            lock(files).settle(quota);
        }
    }

    /// True when `fd` is a file whose last link this process removed while
    /// holding it: its bytes are still counted.
    fn orphaned(&mut self, fd: &Resource<types::Descriptor>) -> bool {
        let Some(files) = &self.files else {
            return false;
        };
        match self.inner.table.get(fd) {
            Ok(Descriptor::File(file)) => lock(files).is_orphan(&file.file),
            _ => false,
        }
    }

    fn reserve(&self, bytes: u64) -> FsResult<()> {
        match &self.quota {
            Some(quota) if !quota.reserve(bytes) => Err(full()),
            _ => Ok(()),
        }
    }

    fn release(&self, bytes: u64) {
        if let Some(quota) = &self.quota {
            quota.release(bytes);
        }
    }

    /// Runs `op` with `bytes` reserved, giving them back if it fails.
    async fn reserved<T>(
        &mut self,
        bytes: u64,
        op: impl AsyncFnOnce(&mut WasiFilesystemCtxView<'_>) -> FsResult<T>,
    ) -> FsResult<T> {
        self.reserve(bytes)?;
        let done = op(&mut self.inner).await;
        if done.is_err() {
            self.release(bytes);
        }
        done
    }

    async fn size(&mut self, fd: &Resource<types::Descriptor>) -> FsResult<u64> {
        Ok(HostDescriptor::stat(&mut self.inner, again(fd)).await?.size)
    }

    /// What is at `path` now: the link itself unless `flags` follow it.
    async fn stat_at(
        &mut self,
        dir: &Resource<types::Descriptor>,
        flags: types::PathFlags,
        path: &str,
    ) -> Option<types::DescriptorStat> {
        HostDescriptor::stat_at(&mut self.inner, again(dir), flags, path.to_string())
            .await
            .ok()
    }

    /// Wraps a file's output stream so that each write's growth is counted
    /// (from `position`, or at the end when appending).
    fn counted(
        &mut self,
        fd: &Resource<types::Descriptor>,
        stream: Resource<DynOutputStream>,
        position: Option<u64>,
    ) -> FsResult<Resource<DynOutputStream>> {
        let Some(quota) = self.quota.clone() else {
            return Ok(stream);
        };
        let file = match self.inner.table.get(fd)? {
            Descriptor::File(file) => file.file.clone(),
            Descriptor::Dir(_) => return Err(ErrorCode::IsDirectory.into()),
        };
        let inner = self.inner.table.delete(stream)?;
        let counted: DynOutputStream = Box::new(CountedStream {
            inner,
            quota,
            file,
            position,
        });
        Ok(self.inner.table.push(counted)?)
    }
}

impl types::Host for SlotFs<'_> {
    fn convert_error_code(&mut self, err: FsError) -> wasmtime::Result<ErrorCode> {
        types::Host::convert_error_code(&mut self.inner, err)
    }

    fn filesystem_error_code(
        &mut self,
        err: Resource<wasmtime::Error>,
    ) -> wasmtime::Result<Option<ErrorCode>> {
        types::Host::filesystem_error_code(&mut self.inner, err)
    }
}

impl HostDescriptor for SlotFs<'_> {
    async fn advise(
        &mut self,
        fd: Resource<types::Descriptor>,
        offset: types::Filesize,
        len: types::Filesize,
        advice: types::Advice,
    ) -> FsResult<()> {
        HostDescriptor::advise(&mut self.inner, fd, offset, len, advice).await
    }

    async fn sync_data(&mut self, fd: Resource<types::Descriptor>) -> FsResult<()> {
        HostDescriptor::sync_data(&mut self.inner, fd).await
    }

    async fn get_flags(
        &mut self,
        fd: Resource<types::Descriptor>,
    ) -> FsResult<types::DescriptorFlags> {
        HostDescriptor::get_flags(&mut self.inner, fd).await
    }

    async fn get_type(&mut self, fd: Resource<types::Descriptor>) -> FsResult<DescriptorType> {
        HostDescriptor::get_type(&mut self.inner, fd).await
    }

    async fn set_size(
        &mut self,
        fd: Resource<types::Descriptor>,
        size: types::Filesize,
    ) -> FsResult<()> {
        if self.quota.is_none() {
            return HostDescriptor::set_size(&mut self.inner, fd, size).await;
        }
        let stat = HostDescriptor::stat(&mut self.inner, again(&fd)).await?;
        let grows = size.saturating_sub(stat.size);
        self.reserved(grows, async |inner| {
            HostDescriptor::set_size(inner, again(&fd), size).await
        })
        .await?;
        // Bytes of a file with no link left were given back already,
        // unless it is one of the process's orphans (still counted).
        if size < stat.size && (stat.link_count == 1 || self.orphaned(&fd)) {
            self.release(stat.size - size);
        }
        Ok(())
    }

    async fn set_times(
        &mut self,
        fd: Resource<types::Descriptor>,
        atim: types::NewTimestamp,
        mtim: types::NewTimestamp,
    ) -> FsResult<()> {
        HostDescriptor::set_times(&mut self.inner, fd, atim, mtim).await
    }

    async fn read(
        &mut self,
        fd: Resource<types::Descriptor>,
        len: types::Filesize,
        offset: types::Filesize,
    ) -> FsResult<(Vec<u8>, bool)> {
        HostDescriptor::read(&mut self.inner, fd, len, offset).await
    }

    async fn write(
        &mut self,
        fd: Resource<types::Descriptor>,
        buf: Vec<u8>,
        offset: types::Filesize,
    ) -> FsResult<types::Filesize> {
        if self.quota.is_none() {
            return HostDescriptor::write(&mut self.inner, fd, buf, offset).await;
        }
        let size = self.size(&fd).await?;
        let end = offset.saturating_add(buf.len() as u64);
        let grows = end.saturating_sub(size);
        let written = self
            .reserved(grows, async |inner| {
                HostDescriptor::write(inner, fd, buf, offset).await
            })
            .await?;
        // A short write grew the file less than was reserved.
        let grew = offset.saturating_add(written).saturating_sub(size);
        self.release(grows.saturating_sub(grew));
        Ok(written)
    }

    async fn read_directory(
        &mut self,
        fd: Resource<types::Descriptor>,
    ) -> FsResult<Resource<types::DirectoryEntryStream>> {
        HostDescriptor::read_directory(&mut self.inner, fd).await
    }

    async fn sync(&mut self, fd: Resource<types::Descriptor>) -> FsResult<()> {
        HostDescriptor::sync(&mut self.inner, fd).await
    }

    async fn create_directory_at(
        &mut self,
        fd: Resource<types::Descriptor>,
        path: String,
    ) -> FsResult<()> {
        self.reserved(ENTRY_BYTES, async |inner| {
            HostDescriptor::create_directory_at(inner, fd, path).await
        })
        .await
    }

    async fn stat(&mut self, fd: Resource<types::Descriptor>) -> FsResult<types::DescriptorStat> {
        HostDescriptor::stat(&mut self.inner, fd).await
    }

    async fn stat_at(
        &mut self,
        fd: Resource<types::Descriptor>,
        path_flags: types::PathFlags,
        path: String,
    ) -> FsResult<types::DescriptorStat> {
        HostDescriptor::stat_at(&mut self.inner, fd, path_flags, path).await
    }

    async fn set_times_at(
        &mut self,
        fd: Resource<types::Descriptor>,
        path_flags: types::PathFlags,
        path: String,
        atim: types::NewTimestamp,
        mtim: types::NewTimestamp,
    ) -> FsResult<()> {
        HostDescriptor::set_times_at(&mut self.inner, fd, path_flags, path, atim, mtim).await
    }

    async fn link_at(
        &mut self,
        fd: Resource<types::Descriptor>,
        old_path_flags: types::PathFlags,
        old_path: String,
        new_descriptor: Resource<types::Descriptor>,
        new_path: String,
    ) -> FsResult<()> {
        self.reserved(ENTRY_BYTES, async |inner| {
            HostDescriptor::link_at(
                inner,
                fd,
                old_path_flags,
                old_path,
                new_descriptor,
                new_path,
            )
            .await
        })
        .await
    }

    async fn open_at(
        &mut self,
        fd: Resource<types::Descriptor>,
        path_flags: types::PathFlags,
        path: String,
        oflags: types::OpenFlags,
        flags: types::DescriptorFlags,
    ) -> FsResult<Resource<types::Descriptor>> {
        if self.quota.is_none() {
            return HostDescriptor::open_at(&mut self.inner, fd, path_flags, path, oflags, flags)
                .await;
        }
        self.settle();
        let changes = oflags.intersects(types::OpenFlags::CREATE | types::OpenFlags::TRUNCATE);
        if !changes {
            let opened =
                HostDescriptor::open_at(&mut self.inner, fd, path_flags, path, oflags, flags)
                    .await?;
            self.track(&opened).await;
            return Ok(opened);
        }
        // Looked up as the open will: through a link if it follows links,
        // so that a file made through a dangling link is counted too.
        let before = self.stat_at(&fd, path_flags, &path).await;
        let made = match &before {
            None if oflags.contains(types::OpenFlags::CREATE) => ENTRY_BYTES,
            _ => 0,
        };
        let opened = self
            .reserved(made, async |inner| {
                HostDescriptor::open_at(inner, fd, path_flags, path, oflags, flags).await
            })
            .await?;
        if let Some(stat) = before
            && oflags.contains(types::OpenFlags::TRUNCATE)
            && stat.type_ == DescriptorType::RegularFile
            && stat.link_count == 1
        {
            self.release(stat.size);
        }
        self.track(&opened).await;
        Ok(opened)
    }

    fn drop(&mut self, fd: Resource<types::Descriptor>) -> wasmtime::Result<()> {
        let rep = fd.rep();
        let dropped = HostDescriptor::drop(&mut self.inner, fd);
        if let Some(files) = &self.files {
            lock(files).open.remove(&rep);
        }
        self.settle();
        dropped
    }

    async fn readlink_at(
        &mut self,
        fd: Resource<types::Descriptor>,
        path: String,
    ) -> FsResult<String> {
        HostDescriptor::readlink_at(&mut self.inner, fd, path).await
    }

    async fn remove_directory_at(
        &mut self,
        fd: Resource<types::Descriptor>,
        path: String,
    ) -> FsResult<()> {
        HostDescriptor::remove_directory_at(&mut self.inner, fd, path).await?;
        self.release(ENTRY_BYTES);
        Ok(())
    }

    async fn rename_at(
        &mut self,
        fd: Resource<types::Descriptor>,
        old_path: String,
        new_fd: Resource<types::Descriptor>,
        new_path: String,
    ) -> FsResult<()> {
        if self.quota.is_none() {
            return HostDescriptor::rename_at(&mut self.inner, fd, old_path, new_fd, new_path)
                .await;
        }
        // What the rename replaces is freed, unless it is the same file.
        let replaced = match self
            .stat_at(&new_fd, types::PathFlags::empty(), &new_path)
            .await
        {
            Some(stat) => {
                let flags = types::PathFlags::empty();
                let hash = |h: types::MetadataHashValue| (h.lower, h.upper);
                let old = HostDescriptor::metadata_hash_at(
                    &mut self.inner,
                    again(&fd),
                    flags,
                    old_path.clone(),
                )
                .await
                .map(hash);
                let new = HostDescriptor::metadata_hash_at(
                    &mut self.inner,
                    again(&new_fd),
                    flags,
                    new_path.clone(),
                )
                .await
                .map(hash);
                let (old, new) = (old.ok(), new.ok());
                let same = old.is_some() && old == new;
                (!same).then(|| self.last_link_gone(&stat, new))
            }
            None => None,
        };
        HostDescriptor::rename_at(&mut self.inner, fd, old_path, new_fd, new_path).await?;
        if let Some(bytes) = replaced {
            self.release(bytes);
        }
        Ok(())
    }

    async fn symlink_at(
        &mut self,
        fd: Resource<types::Descriptor>,
        src_path: String,
        dest_path: String,
    ) -> FsResult<()> {
        self.reserved(ENTRY_BYTES, async |inner| {
            HostDescriptor::symlink_at(inner, fd, src_path, dest_path).await
        })
        .await
    }

    async fn unlink_file_at(
        &mut self,
        fd: Resource<types::Descriptor>,
        path: String,
    ) -> FsResult<()> {
        if self.quota.is_none() {
            return HostDescriptor::unlink_file_at(&mut self.inner, fd, path).await;
        }
        let stat = self.stat_at(&fd, types::PathFlags::empty(), &path).await;
        let identity = self.identity_at(&fd, &path).await;
        HostDescriptor::unlink_file_at(&mut self.inner, fd, path).await?;
        if let Some(stat) = stat {
            let freed = self.last_link_gone(&stat, identity);
            self.release(freed);
        }
        Ok(())
    }

    fn read_via_stream(
        &mut self,
        fd: Resource<types::Descriptor>,
        offset: types::Filesize,
    ) -> FsResult<Resource<wasmtime_wasi::p2::DynInputStream>> {
        HostDescriptor::read_via_stream(&mut self.inner, fd, offset)
    }

    fn write_via_stream(
        &mut self,
        fd: Resource<types::Descriptor>,
        offset: types::Filesize,
    ) -> FsResult<Resource<DynOutputStream>> {
        let stream = HostDescriptor::write_via_stream(&mut self.inner, again(&fd), offset)?;
        self.counted(&fd, stream, Some(offset))
    }

    fn append_via_stream(
        &mut self,
        fd: Resource<types::Descriptor>,
    ) -> FsResult<Resource<DynOutputStream>> {
        let stream = HostDescriptor::append_via_stream(&mut self.inner, again(&fd))?;
        self.counted(&fd, stream, None)
    }

    async fn is_same_object(
        &mut self,
        a: Resource<types::Descriptor>,
        b: Resource<types::Descriptor>,
    ) -> wasmtime::Result<bool> {
        HostDescriptor::is_same_object(&mut self.inner, a, b).await
    }

    async fn metadata_hash(
        &mut self,
        fd: Resource<types::Descriptor>,
    ) -> FsResult<types::MetadataHashValue> {
        HostDescriptor::metadata_hash(&mut self.inner, fd).await
    }

    async fn metadata_hash_at(
        &mut self,
        fd: Resource<types::Descriptor>,
        path_flags: types::PathFlags,
        path: String,
    ) -> FsResult<types::MetadataHashValue> {
        HostDescriptor::metadata_hash_at(&mut self.inner, fd, path_flags, path).await
    }
}

impl HostDirectoryEntryStream for SlotFs<'_> {
    async fn read_directory_entry(
        &mut self,
        stream: Resource<types::DirectoryEntryStream>,
    ) -> FsResult<Option<types::DirectoryEntry>> {
        HostDirectoryEntryStream::read_directory_entry(&mut self.inner, stream).await
    }

    fn drop(&mut self, stream: Resource<types::DirectoryEntryStream>) -> wasmtime::Result<()> {
        HostDirectoryEntryStream::drop(&mut self.inner, stream)
    }
}

/// A file's output stream whose growth is reserved before each write.
struct CountedStream {
    inner: DynOutputStream,
    quota: Arc<SlotQuota>,
    /// The file, for its size at each write: a stream may only write once
    /// its last write is done (`check-write`), so the size is current.
    file: Arc<std::fs::File>,
    /// Where the next write lands (`None`: at the end, appending).
    position: Option<u64>,
}

/// ENOSPC, as the stream's error: what the program's libc knows.
fn no_space() -> StreamError {
    StreamError::LastOperationFailed(std::io::Error::from_raw_os_error(28).into())
}

#[wasmtime_wasi::async_trait]
impl Pollable for CountedStream {
    async fn ready(&mut self) {
        self.inner.ready().await
    }
}

#[wasmtime_wasi::async_trait]
impl OutputStream for CountedStream {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        let size = self
            .file
            .metadata()
            .map_err(|e| StreamError::LastOperationFailed(e.into()))?
            .len();
        let start = self.position.unwrap_or(size);
        let after = start.saturating_add(bytes.len() as u64);
        let grows = after.saturating_sub(size);
        if !self.quota.reserve(grows) {
            return Err(no_space());
        }
        if let Err(e) = self.inner.write(bytes) {
            self.quota.release(grows);
            return Err(e);
        }
        if let Some(position) = &mut self.position {
            *position = after;
        }
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        self.inner.flush()
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        self.inner.check_write()
    }

    async fn cancel(&mut self) {
        self.inner.cancel().await
    }
}

//! The host's memory in the two forks of it that never `exec`.
//!
//! The keeper and a namespaced worker's init are forks of the host that stay for the worker's
//! whole life. A fork shares every page of its parent copy-on-write, so each would hold a
//! snapshot of all the host's memory: every page the host writes afterwards is copied, and
//! the old page stays resident for the keeper and init. A host of 1 GiB that spawned four
//! workers and then rewrote its data was measured holding 3.2 GiB more than before, and init,
//! inside the worker's namespaces, would hold whatever secrets the host's heap held.
//!
//! So both drop that memory once their set-up is done and only their wait loop is left:
//! [`HostMemory::read`] lists the private anonymous mappings (the heap, other threads' stacks,
//! `mmap`ed buffers) from `/proc/self/maps` while the host's `/proc` is still mounted, and
//! [`HostMemory::drop_all`] unmaps them. What the loop still runs on stays: this thread's own
//! stack (which also holds its thread-local storage), and the file-backed mappings (the code,
//! libc's data) with the anonymous `.bss` that follows each (libc's and the loader's
//! globals). An unmapped page touched by mistake is a crash of the keeper or init (the
//! host sees the worker end), never a silent read of other memory.
//!
//! Still held: pages of private file mappings the host wrote to (its own and its libraries'
//! `.data`, a file it mapped privately and changed) and shared mappings, which are the
//! host's own memory rather than copies of it. The list is read once, before init is
//! cloned; nothing may map memory between then and the unmapping (a range reaches over the
//! unmapped gaps between anonymous mappings, and would take a new mapping there with it).
//!
//! Between fork and `exec` nothing may allocate: the list is a fixed array on the stack, and
//! `/proc/self/maps` is read through a fixed buffer.
//!
//! The host's signal handlers are inherited too, and the keeper keeps them until then (init
//! resets its own): each would run on the host's memory (tokio's reads its registry on the
//! heap), so before the unmapping every handled signal becomes ignored, but `SIGCHLD`, which
//! goes back to its default. A handled signal still changes nothing (the handler returned),
//! and the keeper still ends as its worker did.

use std::os::fd::OwnedFd;

/// Ranges kept at most. Anonymous mappings with only unmapped gaps between them merge into
/// one range (unmapping a gap does nothing), so only the mappings that stay (files, shared
/// memory, the stack) separate ranges and a host rarely has more; past it the largest are
/// kept, which hold most of the memory.
const MAX_RANGES: usize = 256;

/// Bytes of `/proc/self/maps` read at a time: a line longer than this has a long path, so it
/// is file-backed and skipped without being parsed.
const READ_CHUNK: usize = 4096;

/// The private anonymous mappings of this process, except the one holding the calling
/// thread's stack. A plain value: a fork copies it with its stack.
#[derive(Clone, Copy)]
pub(crate) struct HostMemory {
    ranges: [(usize, usize); MAX_RANGES],
    len: usize,
    /// The range the next anonymous mapping extends: the last one listed, unless a mapping
    /// that stays came after it (a range reaching over that would unmap it).
    open: Option<usize>,
    /// Where the last line's mapping ends, if it maps a file: an unnamed anonymous mapping
    /// that starts right there is that file's `.bss` (libc's and the loader's globals), which
    /// stays.
    file_end: Option<usize>,
}

impl HostMemory {
    /// No mappings: what [`read`](Self::read) gives when `/proc` cannot be read.
    pub(crate) const fn empty() -> Self {
        Self {
            ranges: [(0, 0); MAX_RANGES],
            len: 0,
            open: None,
            file_end: None,
        }
    }

    /// Reads this process's mappings from `/proc/self/maps`, without allocating. Call it in
    /// the forked child while the host's `/proc` is still its own; empty if it cannot be read.
    pub(crate) fn read() -> Self {
        let marker = 0u8;
        let stack = std::ptr::addr_of!(marker) as usize;
        let mut found = Self::empty();
        let Ok(maps) = rustix::fs::open(
            c"/proc/self/maps",
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        ) else {
            return found;
        };
        found.read_from(&maps, stack);
        found
    }

    fn read_from(&mut self, maps: &OwnedFd, stack: usize) {
        let mut lines = Lines::new();
        loop {
            match rustix::io::read(maps, lines.space()) {
                Ok(0) => break,
                Ok(n) => lines.filled(n, |line| self.add_line(line, stack)),
                Err(rustix::io::Errno::INTR) => continue,
                Err(_) => break,
            }
        }
    }

    /// Records `line` if it is a private anonymous mapping that does not hold `stack` and is
    /// not a file's `.bss`; any other line (one that could not be read whole too) is a
    /// mapping that stays.
    fn add_line(&mut self, line: &[u8], stack: usize) {
        let mapping = parse_line(line);
        let after_file = self.file_end.take();
        self.file_end = mapping.and_then(|m| m.file_backed.then_some(m.end));
        match mapping {
            Some(m)
                if m.anonymous
                    && !(m.start..m.end).contains(&stack)
                    && !(m.unnamed && after_file == Some(m.start)) =>
            {
                self.add(m.start, m.end)
            }
            _ => self.keep_mapping(),
        }
    }

    /// A mapping that stays lies between the last range and the next: they stay apart.
    fn keep_mapping(&mut self) {
        self.open = None;
    }

    /// Adds the next anonymous mapping, `maps` order (ascending): it extends the open range
    /// over the gap between them, or starts a new one.
    fn add(&mut self, start: usize, end: usize) {
        if let Some(open) = self.open {
            self.ranges[open].1 = end;
            return;
        }
        if self.len < MAX_RANGES {
            self.ranges[self.len] = (start, end);
            self.open = Some(self.len);
            self.len += 1;
            return;
        }
        // Full: the new range replaces the smallest one if it is larger (and stays open;
        // else the next starts afresh, as nothing else may reach over this one's place).
        let size = |r: &(usize, usize)| r.1 - r.0;
        let smallest = (0..self.len).min_by_key(|i| size(&self.ranges[*i]));
        if let Some(smallest) = smallest.filter(|i| size(&self.ranges[*i]) < end - start) {
            self.ranges[smallest] = (start, end);
            self.open = Some(smallest);
        }
    }

    /// The ranges listed, in the order they were read.
    pub(crate) fn ranges(&self) -> &[(usize, usize)] {
        &self.ranges[..self.len]
    }

    /// Unmaps every listed range. Only for a forked copy of the host that will run nothing
    /// but system calls on its own stack until it exits (see the module docs). First, no
    /// handler of the host's may run any more: it would fault on the memory unmapped here.
    pub(crate) fn drop_all(&self) {
        crate::sys::ignore_handled_signals();
        for &(start, end) in self.ranges() {
            crate::sys::unmap_forked_host_memory(start, end - start);
        }
    }
}

/// One line of `/proc/self/maps`.
#[derive(Clone, Copy)]
struct Mapping {
    start: usize,
    end: usize,
    /// Private (`p`), no file (inode 0), and the heap, a stack, or unnamed or named
    /// anonymous memory. Special mappings (`[vdso]`, `[vvar]`, `[vsyscall]`, `[uprobes]`) are
    /// not ours to unmap, and shared memory is not a copy of the host's.
    anonymous: bool,
    /// Anonymous and without a name.
    unnamed: bool,
    /// Maps a file (inode not 0).
    file_backed: bool,
}

/// `start-end perms offset dev inode [path]`.
fn parse_line(line: &[u8]) -> Option<Mapping> {
    let mut fields = line.split(|b| *b == b' ').filter(|field| !field.is_empty());
    let range = fields.next()?;
    let perms = fields.next()?;
    let _offset = fields.next()?;
    let _device = fields.next()?;
    let inode = fields.next()?;
    let path = fields.next().unwrap_or_default();
    let dash = range.iter().position(|b| *b == b'-')?;
    let start = hex(&range[..dash])?;
    let end = hex(&range[dash + 1..])?;
    if start >= end {
        return None;
    }
    let private_without_file = perms.get(3) == Some(&b'p') && inode == b"0";
    let anonymous = private_without_file
        && (path.is_empty()
            || path == b"[heap]"
            || path.starts_with(b"[stack")
            || path.starts_with(b"[anon:"));
    Some(Mapping {
        start,
        end,
        anonymous,
        unnamed: anonymous && path.is_empty(),
        file_backed: inode != b"0",
    })
}

fn hex(digits: &[u8]) -> Option<usize> {
    if digits.is_empty() || digits.len() > 2 * std::mem::size_of::<usize>() {
        return None;
    }
    digits.iter().try_fold(0usize, |value, digit| {
        let d = (*digit as char).to_digit(16)?;
        Some(value << 4 | d as usize)
    })
}

/// Splits what `read` returns into lines, in a fixed buffer.
struct Lines {
    buf: [u8; READ_CHUNK],
    len: usize,
    /// Dropping the rest of a line longer than the buffer.
    skipping: bool,
}

impl Lines {
    fn new() -> Self {
        Self {
            buf: [0; READ_CHUNK],
            len: 0,
            skipping: false,
        }
    }

    /// Where the next read goes.
    fn space(&mut self) -> &mut [u8] {
        &mut self.buf[self.len..]
    }

    /// `n` bytes were read into [`space`](Self::space): hands every whole line to `each`.
    fn filled(&mut self, n: usize, mut each: impl FnMut(&[u8])) {
        self.len += n;
        let mut start = 0;
        while let Some(newline) = self.buf[start..self.len].iter().position(|b| *b == b'\n') {
            if !self.skipping {
                each(&self.buf[start..start + newline]);
            }
            self.skipping = false;
            start += newline + 1;
        }
        self.buf.copy_within(start..self.len, 0);
        self.len -= start;
        if self.len == self.buf.len() && !self.skipping {
            // A line longer than the buffer: a long path, so not anonymous memory. It is a
            // line all the same (a mapping that stays): handed on empty, which lists nothing.
            each(&[]);
            self.skipping = true;
        }
        if self.len == self.buf.len() {
            self.len = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
5581c2a00000-5581c2a2e000 r--p 00000000 08:01 1835044                    /usr/bin/host
5581c2e2e000-5581c2e31000 rw-p 0042e000 08:01 1835044                    /usr/bin/host
5581c2e31000-5581c2e40000 rw-p 00000000 00:00 0 
5581c4000000-5581c4021000 rw-p 00000000 00:00 0                          [heap]
7f0000000000-7f0000021000 rw-p 00000000 00:00 0 
7f0000021000-7f0004000000 ---p 00000000 00:00 0 
7f1000000000-7f1040000000 rw-s 00000000 00:01 4096                       /dev/zero (deleted)
7f2000000000-7f2000800000 rw-p 00000000 00:00 0                          [anon:buffers]
7f3000000000-7f3000001000 ---p 00000000 00:00 0 
7f3000001000-7f3000801000 rw-p 00000000 00:00 0 
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]
7ffd000fe000-7ffd00100000 r--p 00000000 00:00 0                          [vvar]
7ffd00100000-7ffd00102000 r-xp 00000000 00:00 0                          [vdso]
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]
";

    fn parse(text: &str, stack: usize, chunk: usize) -> Vec<(usize, usize)> {
        let mut found = HostMemory::empty();
        let mut lines = Lines::new();
        for piece in text.as_bytes().chunks(chunk) {
            let mut piece = piece;
            while !piece.is_empty() {
                let space = lines.space();
                let n = space.len().min(piece.len());
                space[..n].copy_from_slice(&piece[..n]);
                lines.filled(n, |line| found.add_line(line, stack));
                piece = &piece[n..];
            }
        }
        found.ranges().to_vec()
    }

    #[test]
    fn only_private_anonymous_mappings_are_listed_and_merge_over_gaps_only() {
        // The thread's stack: the mapping after its guard page.
        let stack = 0x7f3000400000;
        // The binary's `.bss` (right after its file) stays; the heap reaches over the gap to
        // the next anonymous mappings; the shared mapping and the stack end a range; the
        // special mappings are not listed.
        let expected = vec![
            (0x5581c4000000, 0x7f0004000000),
            (0x7f2000000000, 0x7f3000001000),
            (0x7ffd00000000, 0x7ffd00021000),
        ];
        assert_eq!(parse(MAPS, stack, 4096), expected);
        // However the reads split the lines.
        for chunk in [1, 7, 64, 100] {
            assert_eq!(parse(MAPS, stack, chunk), expected, "chunk {chunk}");
        }
    }

    #[test]
    fn a_line_longer_than_the_buffer_is_skipped_whole_and_keeps_its_neighbours_apart() {
        let long = format!(
            "7f3000000000-7f3000001000 rw-p 00000000 00:00 0 \n\
             7f4000000000-7f4000001000 r-xp 00000000 08:01 42 /{}\n\
             7f5000000000-7f5000001000 rw-p 00000000 00:00 0 \n",
            "x".repeat(READ_CHUNK * 2)
        );
        let expected = vec![
            (0x7f3000000000, 0x7f3000001000),
            (0x7f5000000000, 0x7f5000001000),
        ];
        for chunk in [1, 512, READ_CHUNK] {
            assert_eq!(parse(&long, 0, chunk), expected, "chunk {chunk}");
        }
        // Exactly as long as the buffer, with or without its newline: skipped the same.
        let path = "y".repeat(READ_CHUNK - "7f4000000000-7f4000001000 r-xp 0 08:01 42 /".len());
        for extra in [0, 1] {
            let exact = format!(
                "7f3000000000-7f3000001000 rw-p 00000000 00:00 0 \n\
                 7f4000000000-7f4000001000 r-xp 0 08:01 42 /{}{}\n\
                 7f5000000000-7f5000001000 rw-p 00000000 00:00 0 \n",
                path,
                "z".repeat(extra)
            );
            assert_eq!(parse(&exact, 0, 100), expected, "extra {extra}");
        }
    }

    #[test]
    fn a_line_one_short_of_the_buffer_is_parsed() {
        let name =
            "n".repeat(READ_CHUNK - 1 - "7f4000000000-7f4000001000 rw-p 0 00:00 0 [anon:]".len());
        let line = format!("7f4000000000-7f4000001000 rw-p 0 00:00 0 [anon:{name}]\n");
        assert_eq!(line.len(), READ_CHUNK);
        assert_eq!(parse(&line, 0, 100), vec![(0x7f4000000000, 0x7f4000001000)]);
    }

    #[test]
    fn past_the_cap_the_largest_ranges_are_kept() {
        let mut found = HostMemory::empty();
        // Disjoint ranges of growing size: the later, larger ones push out the smallest.
        for i in 0..(MAX_RANGES + 10) {
            let start = i * 0x100_0000;
            found.add(start, start + 0x1000 * (i + 1));
            found.keep_mapping();
        }
        assert_eq!(found.ranges().len(), MAX_RANGES);
        let smallest = found.ranges().iter().map(|r| r.1 - r.0).min();
        assert_eq!(smallest, Some(0x1000 * 11));
    }

    #[test]
    fn past_the_cap_a_range_never_reaches_over_a_mapping_that_stays() {
        let mut found = HostMemory::empty();
        for i in 0..MAX_RANGES {
            let start = (i + 1) * 0x100_0000;
            found.add(start, start + 0x10_0000);
            found.keep_mapping();
        }
        // Too small to be kept: the next one must not extend a range kept before it.
        found.add(0x7000_0000_0000, 0x7000_0000_1000);
        found.add(0x7000_1000_0000, 0x7000_2000_0000);
        let reaching = found
            .ranges()
            .iter()
            .filter(|r| r.0 < 0x7000_0000_0000 && r.1 > 0x7000_0000_0000)
            .count();
        assert_eq!(reaching, 0, "{:x?}", found.ranges());
        assert!(found
            .ranges()
            .contains(&(0x7000_1000_0000, 0x7000_2000_0000)));
    }

    #[test]
    fn this_process_lists_its_heap_but_not_the_stack_it_reads_on() {
        let buffer = vec![7u8; 8 << 20];
        let found = HostMemory::read();
        let at = buffer.as_ptr() as usize;
        assert!(
            found.ranges().iter().any(|r| (r.0..r.1).contains(&at)),
            "an 8 MiB buffer is anonymous memory"
        );
        let local = 0u8;
        let here = std::ptr::addr_of!(local) as usize;
        assert!(!found.ranges().iter().any(|r| (r.0..r.1).contains(&here)));
    }
}

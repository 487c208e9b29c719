//! The host's memory in the two forks of it that never `exec`.
//!
//! The keeper and a namespaced worker's init are forks of the host that stay for the worker's
//! whole life. A fork shares every page of its parent copy-on-write, so each would hold a
//! snapshot of all the host's memory: every page the host writes afterwards is copied, and
//! the old page stays resident for the keeper and init. A host of 1 GiB that spawned four
//! workers and then rewrote its data was measured holding 3.2 GiB more than before, and init,
//! inside the worker's namespaces, would hold whatever secrets the host's heap held.
//!
//! [`HostMemory::read`] lists the private anonymous mappings (the heap, other threads' stacks,
//! `mmap`ed buffers) from `/proc/self/maps` while the host's `/proc` is still mounted. Before
//! the keeper makes any child, [`HostMemory::withhold_from_children_except`] marks them all
//! `MADV_DONTFORK` but for the pages of [`Kept`]: the plan's own buffers and the stack init
//! starts the worker on (`ChildPlan::footprint`). So init, and the child that makes it,
//! never get the host's memory, and their forks copy and tear down only those pages, however
//! large the host: the keeper's fork of the host is the spawn's one copy of it. Marking costs
//! a few system calls per range, where unmapping would walk every page the keeper has. Both drop
//! the rest once their set-up is done and only their wait loop is left:
//! [`HostMemory::drop_all`] unmaps every range listed (the keeper its copy of the host, init
//! the plan's pages). What the loop still runs on stays: this thread's own
//! stack (which also holds its thread-local storage), and the file-backed mappings (the code,
//! libc's data) with the anonymous `.bss` that follows each (libc's and the loader's
//! globals). An unmapped page touched by mistake is a crash of the keeper or init (the
//! host sees the worker end), never a silent read of other memory.
//!
//! Still held: pages of private file mappings the host wrote to (its own and its libraries'
//! `.data`, a file it mapped privately and changed) and shared mappings, which are the
//! host's own memory rather than copies of it. The list is read once, before any child is
//! made; nothing may map memory between then and the marking (a range reaches over the
//! unmapped gaps between anonymous mappings, and would take a new mapping there with it),
//! and what is mapped later goes with the unmapping.
//!
//! Between fork and `exec` nothing may allocate: the list is a fixed array on the stack, and
//! `/proc/self/maps` is read through a fixed buffer. In init nothing could: the allocator's
//! own memory is the host's, withheld.
//!
//! The host's signal handlers are inherited too: each would run on the host's memory (tokio's
//! reads its registry on the heap), which the keeper's children never have, so before the
//! keeper makes one every handled signal becomes ignored, but `SIGCHLD`, which goes back to
//! its default (init then resets all its own). A handled signal still changes nothing (the
//! handler returned), and the keeper still ends as its worker did.

use std::os::fd::OwnedFd;

/// Ranges kept at most. Anonymous mappings with only unmapped gaps between them merge into
/// one range (unmapping a gap does nothing), so only the mappings that stay (files, shared
/// memory, the stack) separate ranges and a host rarely has more; past it the largest are
/// kept, which hold most of the memory.
const MAX_RANGES: usize = 256;

/// Bytes of `/proc/self/maps` read at a time: a line longer than this has a long path, so it
/// is file-backed and skipped without being parsed.
const READ_CHUNK: usize = 4096;

/// The private anonymous mappings of this process, except those holding the calling thread's
/// own memory: its stack and its thread-local storage (with the thread's control block, which
/// libc reads through the thread pointer: the same mapping as the stack for a thread `std`
/// started, one of its own for the main thread). A plain value: a fork copies it with its
/// stack.
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
        thread_local! {
            static THREAD_LOCAL: u8 = const { 0 };
        }
        let marker = 0u8;
        let own = [
            std::ptr::addr_of!(marker) as usize,
            THREAD_LOCAL.with(|local| std::ptr::from_ref(local) as usize),
        ];
        let mut found = Self::empty();
        let Ok(maps) = rustix::fs::open(
            c"/proc/self/maps",
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        ) else {
            return found;
        };
        found.read_from(&maps, own);
        found
    }

    fn read_from(&mut self, maps: &OwnedFd, own: [usize; 2]) {
        let mut lines = Lines::new();
        loop {
            match rustix::io::read(maps, lines.space()) {
                Ok(0) => break,
                Ok(n) => lines.filled(n, |line| self.add_line(line, own)),
                Err(rustix::io::Errno::INTR) => continue,
                Err(_) => break,
            }
        }
    }

    /// Records `line` if it is a private anonymous mapping that holds neither address of
    /// `own` and is not a file's `.bss`; any other line (one that could not be read whole
    /// too) is a mapping that stays.
    fn add_line(&mut self, line: &[u8], own: [usize; 2]) {
        let mapping = parse_line(line);
        let after_file = self.file_end.take();
        self.file_end = mapping.and_then(|m| m.file_backed.then_some(m.end));
        match mapping {
            Some(m)
                if m.anonymous
                    && !own.iter().any(|at| (m.start..m.end).contains(at))
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

    /// Leaves every listed range but the pages of `kept` out of the children this process
    /// makes from now on (`MADV_DONTFORK`): what the keeper does before it makes any, so that
    /// none of them copies the host's memory, or holds it, and the keeper tears its own copy
    /// down only once init runs (see the module docs). Marking a range costs the same
    /// whatever it holds; unmapping it would walk every page. Only for a forked copy of the
    /// host whose children read nothing of the host's memory outside `kept`, their stack and
    /// the file-backed mappings; first, no handler of the host's may run any more (it would
    /// fault in them). Marks nothing, and returns false, where `kept` could not hold every
    /// span it was given.
    pub(crate) fn withhold_from_children_except(&self, kept: &mut Kept) -> bool {
        let Some(kept) = kept.sorted() else {
            return false;
        };
        crate::sys::ignore_handled_signals();
        for &range in self.ranges() {
            outside(range, kept, |start, end| {
                crate::sys::withhold_from_children(start, end - start)
            });
        }
        true
    }
}

/// Spans kept at most: the plan's buffers, many of them on the same pages, which merge.
const MAX_KEPT: usize = 512;

/// The memory the keeper's children still read once the rest of the host's is withheld from
/// them: whole pages, as `madvise` works on pages. A plain value on the stack, filled without
/// allocating.
pub(crate) struct Kept {
    spans: [(usize, usize); MAX_KEPT],
    len: usize,
    /// A span did not fit: keeping only some would drop memory still read.
    overflowed: bool,
}

impl Kept {
    /// Nothing kept yet.
    pub(crate) const fn new() -> Self {
        Self {
            spans: [(0, 0); MAX_KEPT],
            len: 0,
            overflowed: false,
        }
    }

    /// The memory of `value` itself (not what it points to).
    pub(crate) fn value<T>(&mut self, value: &T) {
        self.bytes(std::ptr::from_ref(value) as usize, std::mem::size_of::<T>());
    }

    /// The memory of the items of `slice` (a `Vec`'s buffer, a string's bytes).
    pub(crate) fn slice<T>(&mut self, slice: &[T]) {
        self.bytes(slice.as_ptr() as usize, std::mem::size_of_val(slice));
    }

    /// The bytes of `string`, its terminating NUL included.
    pub(crate) fn c_str(&mut self, string: &std::ffi::CStr) {
        self.slice(string.to_bytes_with_nul());
    }

    /// A `Vec`'s buffer of strings, and each string's bytes.
    pub(crate) fn c_strings(&mut self, strings: &[std::ffi::CString]) {
        self.slice(strings);
        for string in strings {
            self.c_str(string);
        }
    }

    /// `len` bytes at `start`, widened to whole pages. Nothing for no bytes (an empty `Vec`'s
    /// pointer points at nothing).
    pub(crate) fn bytes(&mut self, start: usize, len: usize) {
        if len == 0 {
            return;
        }
        let page = rustix::param::page_size();
        let first = start & !(page - 1);
        let end = start
            .checked_add(len)
            .and_then(|end| end.checked_next_multiple_of(page))
            .unwrap_or(usize::MAX & !(page - 1));
        // Buffers made one after another often share a page with the last one kept.
        if let Some(last) = self.len.checked_sub(1).map(|i| &mut self.spans[i]) {
            if first <= last.1 && end >= last.0 {
                *last = (last.0.min(first), last.1.max(end));
                return;
            }
        }
        match self.spans.get_mut(self.len) {
            Some(span) => {
                *span = (first, end);
                self.len += 1;
            }
            None => self.overflowed = true,
        }
    }

    /// The spans in address order, overlapping ones merged; `None` if one did not fit. Sorts
    /// in place: no allocation.
    fn sorted(&mut self) -> Option<&[(usize, usize)]> {
        if self.overflowed {
            return None;
        }
        let spans = &mut self.spans[..self.len];
        spans.sort_unstable();
        let mut merged = 0usize;
        for i in 0..spans.len() {
            let span = spans[i];
            match merged.checked_sub(1).map(|last| &mut spans[last]) {
                Some(last) if span.0 <= last.1 => last.1 = last.1.max(span.1),
                _ => {
                    spans[merged] = span;
                    merged += 1;
                }
            }
        }
        Some(&self.spans[..merged])
    }
}

/// Hands `each` the pieces of `range` outside every span of `kept` (sorted, disjoint), in
/// address order.
fn outside(range: (usize, usize), kept: &[(usize, usize)], mut each: impl FnMut(usize, usize)) {
    let (mut from, end) = range;
    for &(start, stop) in kept {
        if stop <= from {
            continue;
        }
        if start >= end {
            break;
        }
        if start > from {
            each(from, start);
        }
        from = stop;
        if from >= end {
            return;
        }
    }
    if from < end {
        each(from, end);
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
                lines.filled(n, |line| found.add_line(line, [stack, stack]));
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

    fn pieces(range: (usize, usize), kept: &[(usize, usize)]) -> Vec<(usize, usize)> {
        let mut found = Vec::new();
        outside(range, kept, |start, end| found.push((start, end)));
        found
    }

    #[test]
    fn only_the_pages_outside_every_kept_span_are_withheld() {
        let kept = [(0x3000, 0x5000), (0x8000, 0x9000), (0x20000, 0x21000)];
        assert_eq!(
            pieces((0x1000, 0x10000), &kept),
            vec![(0x1000, 0x3000), (0x5000, 0x8000), (0x9000, 0x10000)]
        );
        // Kept spans at a range's ends, over it whole, or elsewhere.
        assert_eq!(pieces((0x3000, 0x9000), &kept), vec![(0x5000, 0x8000)]);
        assert_eq!(pieces((0x3000, 0x5000), &kept), vec![]);
        assert_eq!(pieces((0x4000, 0x4800), &kept), vec![]);
        assert_eq!(pieces((0x10000, 0x12000), &kept), vec![(0x10000, 0x12000)]);
        assert_eq!(pieces((0x1000, 0x2000), &[]), vec![(0x1000, 0x2000)]);
    }

    #[test]
    fn kept_bytes_widen_to_whole_pages_and_merge() {
        let page = rustix::param::page_size();
        let mut kept = Kept::new();
        kept.bytes(10 * page + 5, 1);
        // Later on the same page, and on the next: one span.
        kept.bytes(10 * page + 100, page);
        kept.bytes(3 * page, 2 * page);
        // Nothing for no bytes, wherever an empty buffer's pointer points.
        kept.bytes(1, 0);
        kept.slice::<u64>(&[]);
        // Inside a span kept earlier, not next to the last one.
        kept.bytes(4 * page + 1, 8);
        assert_eq!(
            kept.sorted(),
            Some(&[(3 * page, 5 * page), (10 * page, 12 * page)][..])
        );
    }

    #[test]
    fn more_spans_than_fit_withhold_nothing() {
        let page = rustix::param::page_size();
        let mut kept = Kept::new();
        for i in 0..MAX_KEPT {
            kept.bytes(2 * i * page, 1);
        }
        assert_eq!(kept.sorted().map(<[_]>::len), Some(MAX_KEPT));
        kept.bytes(2 * MAX_KEPT * page, 1);
        assert_eq!(kept.sorted(), None);
        assert!(!HostMemory::empty().withhold_from_children_except(&mut kept));
    }

    /// A value's own bytes, its buffer and the strings in it each lie inside a kept span.
    #[test]
    fn a_value_and_its_buffers_are_kept() {
        let strings = vec![
            std::ffi::CString::new("a").unwrap(),
            std::ffi::CString::new(vec![b'b'; 10_000]).unwrap(),
        ];
        let mut kept = Kept::new();
        kept.value(&strings);
        kept.slice(&strings);
        for string in &strings {
            kept.c_str(string);
        }
        let spans = kept.sorted().unwrap().to_vec();
        let covered = |at: usize, len: usize| {
            spans
                .iter()
                .any(|&(start, end)| start <= at && at + len <= end)
        };
        assert!(covered(std::ptr::from_ref(&strings) as usize, 24));
        assert!(covered(strings.as_ptr() as usize, 2 * 16));
        for string in &strings {
            let bytes = string.to_bytes_with_nul();
            assert!(covered(bytes.as_ptr() as usize, bytes.len()));
        }
    }

    /// The main thread's thread-local storage and control block lie in a mapping of their
    /// own, which stays as the stack does, and keeps its neighbours apart.
    #[test]
    fn the_mapping_holding_the_threads_own_storage_is_not_listed() {
        let mut found = HostMemory::empty();
        let mut lines = Lines::new();
        let own = [0x7f3000400000, 0x7f0000010000];
        let n = MAPS.len();
        lines.space()[..n].copy_from_slice(MAPS.as_bytes());
        lines.filled(n, |line| found.add_line(line, own));
        assert_eq!(
            found.ranges(),
            [
                (0x5581c4000000, 0x5581c4021000),
                (0x7f0000021000, 0x7f0004000000),
                (0x7f2000000000, 0x7f3000001000),
                (0x7ffd00000000, 0x7ffd00021000),
            ]
        );
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

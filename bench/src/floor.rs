//! The kernel's floor: what writing a relay's frames to loopback TCP
//! sockets costs before any WebSocket, JSON or room logic. One thread on
//! the server's core writes `frame_bytes`-byte frames round-robin to
//! `connections` sockets (each write its own packet: TCP_NODELAY, as the
//! relay); another on the generator's core reads them all. Either one
//! `send` system call per frame, or io_uring with a whole tick's sends
//! submitted in one call (the batching a relay could do across sockets).
//!
//! The writer's CPU is what any relay pays to deliver those frames on this
//! machine: the loopback delivery into the receiving socket is charged to
//! the writer, as it is to the relay. Each frame carries the time it was
//! handed to the kernel, so the reader also measures the latency the
//! kernel alone leaves (paced, a millisecond's frames go out back to back,
//! much as a host's burst does).

use crate::load::{latency, Latency};
use anyhow::{bail, Context as _, Result};
use hdrhistogram::Histogram;
use io_uring::{opcode, types, IoUring};
use serde::Serialize;
use std::io::Read;
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// One `send` system call per frame.
    Send,
    /// io_uring: each tick's sends submitted in one system call.
    Uring,
}

#[derive(Debug, Clone)]
pub struct Params {
    pub mode: Mode,
    pub connections: usize,
    /// Frames per second to offer; 0: as many as the core can write.
    pub rate: u64,
    pub frame_bytes: usize,
    pub duration: Duration,
    /// Stop after this many frames instead (the smoke test's count mode).
    pub frames: Option<u64>,
    /// (reader core, writer core).
    pub pin: Option<(usize, usize)>,
}

#[derive(Debug, Clone, Serialize)]
pub struct FloorResult {
    pub mode: Mode,
    pub connections: usize,
    pub frame_bytes: usize,
    pub offered_per_s: Option<u64>,
    pub sent_per_s: f64,
    /// Sends the kernel refused (socket buffer full): not counted as sent.
    pub refused: u64,
    pub writer_user_pct: f64,
    pub writer_system_pct: f64,
    pub writer_us_per_frame: f64,
    /// The reader's CPU (epoll and `read`), for the receiving half.
    pub reader_pct: f64,
    pub reader_us_per_frame: f64,
    /// From the send call (or the io_uring submission) to the read.
    pub latency: Latency,
}

fn pin_thread(core: usize) -> Result<()> {
    // SAFETY: a zeroed cpu_set_t is valid; CPU_SET writes within it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(core, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error()).context("sched_setaffinity");
        }
    }
    Ok(())
}

/// This thread's (user, system) CPU seconds.
fn thread_cpu() -> (f64, f64) {
    // SAFETY: getrusage fills the zeroed struct it is given.
    unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_THREAD, &mut ru);
        let s = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
        (s(ru.ru_utime), s(ru.ru_stime))
    }
}

/// Nanoseconds since `base`, as a frame carries it.
fn stamp(base: Instant, frame: &mut [u8]) {
    frame[..8].copy_from_slice(&(base.elapsed().as_nanos() as u64).to_le_bytes());
}

/// Calls `frame` for each whole frame that `chunk` completes, keeping an
/// unfinished one in `partial` for the next chunk.
pub fn whole_frames(
    partial: &mut Vec<u8>,
    chunk: &[u8],
    frame_bytes: usize,
    mut frame: impl FnMut(&[u8]),
) {
    let mut at = 0;
    if !partial.is_empty() {
        at = (frame_bytes - partial.len()).min(chunk.len());
        partial.extend_from_slice(&chunk[..at]);
        if partial.len() == frame_bytes {
            frame(partial);
            partial.clear();
        }
    }
    while at + frame_bytes <= chunk.len() {
        frame(&chunk[at..at + frame_bytes]);
        at += frame_bytes;
    }
    partial.extend_from_slice(&chunk[at..]);
}

/// What the reader got: bytes, CPU seconds, latency in µs.
struct Received {
    bytes: u64,
    cpu_s: f64,
    hist: Histogram<u64>,
}

/// Reads every socket until `expected` bytes came (the writer sets it when
/// done) or nothing came for two seconds, timing every whole frame.
fn read_all(
    clients: Vec<TcpStream>,
    frame_bytes: usize,
    base: Instant,
    expected: &AtomicU64,
) -> Result<Received> {
    // SAFETY: plain epoll calls on descriptors this function owns.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if ep < 0 {
        return Err(std::io::Error::last_os_error()).context("epoll_create1");
    }
    for (i, c) in clients.iter().enumerate() {
        c.set_nonblocking(true)?;
        let mut ev = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLET) as u32,
            u64: i as u64,
        };
        // SAFETY: as above.
        if unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, c.as_raw_fd(), &mut ev) } != 0 {
            return Err(std::io::Error::last_os_error()).context("epoll_ctl");
        }
    }
    let (u0, s0) = thread_cpu();
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 256];
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0u64;
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    // Each socket's unfinished frame: a read may end inside one.
    let mut partial: Vec<Vec<u8>> = vec![Vec::new(); clients.len()];
    let mut last = Instant::now();
    while total < expected.load(Relaxed) && last.elapsed() < Duration::from_secs(2) {
        // SAFETY: `events` has room for 256 entries.
        let n = unsafe { libc::epoll_wait(ep, events.as_mut_ptr(), 256, 50) };
        if n > 0 {
            last = Instant::now();
        }
        for e in &events[..n.max(0) as usize] {
            let i = e.u64 as usize;
            let mut c = &clients[i];
            // Edge-triggered: read until the socket is empty.
            while let Ok(m @ 1..) = c.read(&mut buf) {
                total += m as u64;
                let now = base.elapsed().as_nanos() as u64;
                whole_frames(&mut partial[i], &buf[..m], frame_bytes, |frame| {
                    let mut sent = [0u8; 8];
                    sent.copy_from_slice(&frame[..8]);
                    let sent = u64::from_le_bytes(sent);
                    let _ = hist.record((now.saturating_sub(sent) / 1000).max(1));
                });
            }
        }
    }
    let (u1, s1) = thread_cpu();
    // SAFETY: `ep` is ours and closed once.
    unsafe { libc::close(ep) };
    Ok(Received {
        bytes: total,
        cpu_s: (u1 - u0) + (s1 - s0),
        hist,
    })
}

/// Sends in flight at most, with io_uring.
const RING: usize = 4096;

/// Frames the kernel took, and those it refused (socket buffer full).
#[derive(Default)]
struct Tally {
    sent: u64,
    refused: u64,
}

impl Tally {
    fn note(&mut self, taken: bool) {
        if taken {
            self.sent += 1;
        } else {
            self.refused += 1;
        }
    }
}

/// Counts the sends that completed and frees their buffers.
fn reap(ring: &mut IoUring, free: &mut Vec<usize>, in_flight: &mut usize, tally: &mut Tally) {
    for c in ring.completion() {
        *in_flight -= 1;
        free.push(c.user_data() as usize);
        tally.note(c.result() > 0);
    }
}

pub fn run(p: &Params) -> Result<FloorResult> {
    if p.connections == 0 || p.frame_bytes < 8 {
        bail!("need a connection and frames of at least 8 bytes (the send time)");
    }
    let base = Instant::now();
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let mut clients = Vec::with_capacity(p.connections);
    let mut servers = Vec::with_capacity(p.connections);
    for _ in 0..p.connections {
        let c = TcpStream::connect(addr)?;
        let (s, _) = listener.accept()?;
        c.set_nodelay(true)?;
        s.set_nodelay(true)?;
        s.set_nonblocking(true)?;
        clients.push(c);
        servers.push(s);
    }
    let expected = Arc::new(AtomicU64::new(u64::MAX));
    let reader = {
        let expected = expected.clone();
        let core = p.pin.map(|(r, _)| r);
        let frame_bytes = p.frame_bytes;
        std::thread::spawn(move || {
            if let Some(c) = core {
                pin_thread(c)?;
            }
            read_all(clients, frame_bytes, base, &expected)
        })
    };
    if let Some((_, w)) = p.pin {
        pin_thread(w)?;
    }
    let mut frame = vec![b'x'; p.frame_bytes];
    // io_uring reads a frame when it runs the send: each one in flight
    // needs its own buffer. A slot per ring entry, recycled on completion.
    let mut slots: Vec<Vec<u8>> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    let fds: Vec<i32> = servers.iter().map(|s| s.as_raw_fd()).collect();
    let mut ring = match p.mode {
        Mode::Uring => {
            slots = vec![frame.clone(); RING];
            free = (0..RING).collect();
            Some(IoUring::new(RING as u32).context("io_uring setup")?)
        }
        Mode::Send => None,
    };
    // A tick of 1 ms when paced; batches of 256 when flat out.
    let tick = Duration::from_millis(1);
    let start = Instant::now();
    let (u0, s0) = thread_cpu();
    let (mut tally, mut next) = (Tally::default(), 0usize);
    let mut offered = 0u64;
    let mut in_flight = 0usize;
    let mut at = start;
    let mut written = 0u64;
    let limit = p.frames.unwrap_or(u64::MAX);
    while written < limit && (p.frames.is_some() || start.elapsed() < p.duration) {
        let batch = if p.rate == 0 {
            256.min(limit - written) as usize
        } else {
            at += tick;
            if let Some(wait) = at.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            // What is due by now, so that late ticks catch up.
            let due = (p.rate as f64 * start.elapsed().as_secs_f64()) as u64;
            let n = due.saturating_sub(offered).min(limit - written);
            offered = due;
            n as usize
        };
        written += batch as u64;
        match ring.as_mut() {
            None => {
                for _ in 0..batch {
                    let fd = fds[next % fds.len()];
                    next += 1;
                    stamp(base, &mut frame);
                    // SAFETY: `frame` outlives the call; `fd` is an open socket.
                    let r = unsafe { libc::send(fd, frame.as_ptr().cast(), frame.len(), 0) };
                    tally.note(r > 0);
                }
            }
            Some(ring) => {
                let mut left = batch;
                while left > 0 {
                    // Room in the ring: reap what completed first.
                    reap(ring, &mut free, &mut in_flight, &mut tally);
                    let room = RING - in_flight;
                    if room == 0 {
                        ring.submit_and_wait(1)?;
                        continue;
                    }
                    let now = left.min(room).min(256);
                    for _ in 0..now {
                        let fd = fds[next % fds.len()];
                        next += 1;
                        let slot = free.pop().context("no free send buffer")?;
                        let buf = &mut slots[slot];
                        stamp(base, buf);
                        let e = opcode::Send::new(types::Fd(fd), buf.as_ptr(), buf.len() as u32)
                            .build()
                            .user_data(slot as u64);
                        // SAFETY: the slot's buffer is not touched again
                        // until its send completed (the ring is drained
                        // below before the buffers are dropped).
                        unsafe { ring.submission().push(&e) }
                            .map_err(|_| anyhow::anyhow!("submission queue full"))?;
                    }
                    in_flight += now;
                    left -= now;
                    ring.submit()?;
                }
            }
        }
    }
    if let Some(ring) = ring.as_mut() {
        while in_flight > 0 {
            ring.submit_and_wait(1)?;
            reap(ring, &mut free, &mut in_flight, &mut tally);
        }
    }
    let (u1, s1) = thread_cpu();
    let elapsed = start.elapsed().as_secs_f64();
    let Tally { sent, refused } = tally;
    let want = sent * p.frame_bytes as u64;
    expected.store(want, Relaxed);
    let Received {
        bytes,
        cpu_s: reader_cpu,
        hist,
    } = reader
        .join()
        .map_err(|_| anyhow::anyhow!("the reader panicked"))??;
    if bytes < want {
        bail!("the reader got {bytes} bytes of {want} sent");
    }
    let frames = sent.max(1) as f64;
    Ok(FloorResult {
        mode: p.mode,
        connections: p.connections,
        frame_bytes: p.frame_bytes,
        offered_per_s: (p.rate > 0).then_some(p.rate),
        sent_per_s: sent as f64 / elapsed,
        refused,
        writer_user_pct: 100.0 * (u1 - u0) / elapsed,
        writer_system_pct: 100.0 * (s1 - s0) / elapsed,
        writer_us_per_frame: ((u1 - u0) + (s1 - s0)) * 1e6 / frames,
        reader_pct: 100.0 * reader_cpu / elapsed,
        reader_us_per_frame: reader_cpu * 1e6 / frames,
        latency: latency(&Some(hist)),
    })
}

#[cfg(test)]
mod tests {
    use super::whole_frames;
    use proptest::prelude::*;

    proptest! {
        /// However the stream is cut into reads, each frame comes out once,
        /// whole and in order.
        #[test]
        fn frames_survive_any_cut(
            frame_bytes in 8usize..40,
            count in 0usize..30,
            cuts in proptest::collection::vec(1usize..100, 0..40),
        ) {
            let stream: Vec<u8> = (0..count * frame_bytes).map(|i| (i / frame_bytes) as u8).collect();
            let mut partial = Vec::new();
            let mut seen: Vec<Vec<u8>> = Vec::new();
            let mut at = 0;
            let mut cuts = cuts.into_iter();
            while at < stream.len() {
                let n = cuts.next().unwrap_or(stream.len()).min(stream.len() - at);
                whole_frames(&mut partial, &stream[at..at + n], frame_bytes, |f| seen.push(f.to_vec()));
                at += n;
            }
            prop_assert!(partial.is_empty());
            prop_assert_eq!(seen.len(), count);
            for (k, f) in seen.iter().enumerate() {
                prop_assert_eq!(f, &vec![k as u8; frame_bytes]);
            }
        }
    }
}

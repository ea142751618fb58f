//! The memory a frame costs to decode is a small multiple of its size: the
//! peak heap in use while `parse_frame_bytes` decodes a 16 MiB frame, over
//! the frame's own bytes, for payloads that would cost 20–70× as a tree.
//!
//! One test in its own binary: the counting allocator sees every thread.

use hostwire_worker_rpc::frame::{parse_frame_bytes, Frame, MAX_FRAME_BYTES};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

struct Counting;

static IN_USE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = IN_USE.fetch_add(layout.size(), SeqCst) + layout.size();
            PEAK.fetch_max(now, SeqCst);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        IN_USE.fetch_sub(layout.size(), SeqCst);
    }
}

#[global_allocator]
static A: Counting = Counting;

/// A frame of about `MAX_FRAME_BYTES` whose payload repeats `item`.
fn frame(kind_fields: &str, item: &str) -> Vec<u8> {
    let head = format!(r#"{{"v":"1.0.0",{kind_fields}"#);
    let n = (MAX_FRAME_BYTES - head.len() - 64) / (item.len() + 1);
    let mut s = String::with_capacity(MAX_FRAME_BYTES);
    s.push_str(&head);
    s.push('[');
    s.push_str(&format!("{item},").repeat(n - 1));
    s.push_str(item);
    s.push_str("]}");
    assert!(s.len() <= MAX_FRAME_BYTES);
    s.into_bytes()
}

/// Peak heap over the baseline while `f` runs, in bytes.
fn peak_of<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = IN_USE.load(SeqCst);
    PEAK.store(base, SeqCst);
    let out = f();
    (out, PEAK.load(SeqCst) - base)
}

#[test]
fn decoding_a_16_mib_frame_peaks_at_a_small_multiple_of_its_size() {
    let shapes = [
        (r#""kind":"request","id":1,"method":"m","params":"#, "0"),
        (
            r#""kind":"request","id":1,"method":"m","params":"#,
            r#"{"a":1}"#,
        ),
        (r#""kind":"response","id":1,"ok":true,"result":"#, "[]"),
        (
            r#""kind":"stream-chunk","id":1,"seq":1,"data":"#,
            r#""\ud800""#,
        ),
        (
            r#""kind":"response","id":1,"ok":false,"error":{"code":"E","message":"m","data":"#,
            "1.5",
        ),
    ];
    let mut report = Vec::new();
    for (fields, item) in shapes {
        let mut text = frame(fields, item);
        if fields.contains("\"error\"") {
            // Close the error object too.
            text.pop();
            text.extend_from_slice(b"}}");
        }
        let size = text.len();
        let (parsed, peak) = peak_of(|| parse_frame_bytes(&text));
        let frame = parsed.unwrap_or_else(|e| panic!("{fields}: {e}"));
        assert!(matches!(
            frame,
            Frame::Request { .. } | Frame::Response { .. } | Frame::StreamChunk { .. }
        ));
        drop(frame);
        let ratio = peak as f64 / size as f64;
        let mut line = format!("{item:>10}: frame {size} B, decode peak {peak} B ({ratio:.2}x)");
        if item == r#"{"a":1}"# {
            // For comparison: the same frame as a serde_json tree.
            let (_, tree) = peak_of(|| serde_json::from_slice::<serde_json::Value>(&text).ok());
            line.push_str(&format!(
                "; as a Value tree {:.1}x",
                tree as f64 / size as f64
            ));
        }
        report.push(line);
        assert!(
            peak <= 2 * size + (1 << 20),
            "{item}: decoding a {size} B frame peaked at {peak} B ({ratio:.2}x)"
        );
    }
    println!("{}", report.join("\n"));
}

//! A global allocator that counts the bytes in use and their peak, SQLite's
//! own allocations included, for the memory tests. The counter sees every
//! thread, the server's included: each test holds [`alone`] while it runs.

use std::alloc::{GlobalAlloc, Layout, System};
use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Mutex, MutexGuard, Once};

pub struct Counting;

pub static IN_USE: AtomicUsize = AtomicUsize::new(0);
pub static PEAK: AtomicUsize = AtomicUsize::new(0);

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

/// Held by each memory test for all it does: two at once would count each
/// other's bytes. The first also routes SQLite's allocations through the
/// counter, which must happen before any connection opens.
pub fn alone() -> MutexGuard<'static, ()> {
    static ONE: Mutex<()> = Mutex::new(());
    static SQLITE: Once = Once::new();
    let guard = ONE.lock().unwrap_or_else(|e| e.into_inner());
    SQLITE.call_once(sqlite_alloc::install);
    guard
}

/// SQLite's own allocations (page cache, bound blobs) through the counting
/// allocator: each block keeps its size in a 16-byte header.
mod sqlite_alloc {
    use super::*;
    use rusqlite::ffi;
    use std::alloc::Layout;

    const HEAD: usize = 16;

    fn layout(n: usize) -> Layout {
        Layout::from_size_align(n + HEAD, HEAD).unwrap()
    }
    unsafe extern "C" fn x_malloc(n: c_int) -> *mut c_void {
        let n = n.max(0) as usize;
        let p = unsafe { std::alloc::alloc(layout(n)) };
        if p.is_null() {
            return p.cast();
        }
        unsafe {
            (p as *mut usize).write(n);
            p.add(HEAD).cast()
        }
    }
    unsafe extern "C" fn x_free(p: *mut c_void) {
        if p.is_null() {
            return;
        }
        unsafe {
            let base = (p as *mut u8).sub(HEAD);
            let n = (base as *const usize).read();
            std::alloc::dealloc(base, layout(n));
        }
    }
    unsafe extern "C" fn x_size(p: *mut c_void) -> c_int {
        if p.is_null() {
            return 0;
        }
        unsafe { ((p as *mut u8).sub(HEAD) as *const usize).read() as c_int }
    }
    unsafe extern "C" fn x_realloc(p: *mut c_void, n: c_int) -> *mut c_void {
        let q = unsafe { x_malloc(n) };
        if !p.is_null() && !q.is_null() {
            let old = unsafe { x_size(p) };
            unsafe {
                std::ptr::copy_nonoverlapping(
                    p as *const u8,
                    q as *mut u8,
                    old.min(n.max(0)) as usize,
                )
            };
            unsafe { x_free(p) };
        }
        q
    }
    unsafe extern "C" fn x_roundup(n: c_int) -> c_int {
        (n + 7) & !7
    }
    unsafe extern "C" fn x_init(_: *mut c_void) -> c_int {
        0
    }
    unsafe extern "C" fn x_shutdown(_: *mut c_void) {}

    /// Before any connection opens.
    pub fn install() {
        let methods = ffi::sqlite3_mem_methods {
            xMalloc: Some(x_malloc),
            xFree: Some(x_free),
            xRealloc: Some(x_realloc),
            xSize: Some(x_size),
            xRoundup: Some(x_roundup),
            xInit: Some(x_init),
            xShutdown: Some(x_shutdown),
            pAppData: std::ptr::null_mut(),
        };
        let rc = unsafe { ffi::sqlite3_config(ffi::SQLITE_CONFIG_MALLOC, &methods) };
        assert_eq!(rc, ffi::SQLITE_OK, "SQLite was initialized already");
    }
}

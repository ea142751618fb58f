//! The server raises its open-file soft limit to the hard limit.

#[cfg(unix)]
#[test]
fn the_open_file_limit_is_raised_to_the_hard_limit() {
    // SAFETY: plain getrlimit/setrlimit on local structs.
    let (soft, hard) = unsafe {
        let mut l: libc::rlimit = std::mem::zeroed();
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut l), 0);
        // Start from a lower soft limit so that raising it is observable.
        let lowered = libc::rlimit {
            rlim_cur: l.rlim_max.min(256),
            rlim_max: l.rlim_max,
        };
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lowered), 0);
        (lowered.rlim_cur, l.rlim_max)
    };
    let now = hostwire::app::raise_open_file_limit();
    assert!(now >= soft);
    assert_eq!(now, hard);
}

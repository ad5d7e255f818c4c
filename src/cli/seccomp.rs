//! Seccomp for linnet's per-VM processes: the relay (`linnet-relay`, which
//! `linnet helper` becomes and the daemon starts for a network socket's
//! connection) and `linnet run` once its VMM is started. Each reads what a
//! guest sends, so each gives up, once set up, every system call relaying
//! does not need. A call outside the list stops the process with a line on
//! its stderr naming the call (the daemon logs a network socket relay's
//! stderr); the call itself never runs.
//!
//! Two filters, stacked (the kernel applies the stricter answer):
//!
//! - `clone3` fails with ENOSYS, so threads are started with `clone`
//!   (glibc falls back to it), whose flags a filter can see: clone3's are
//!   behind a pointer;
//! - the allow list (`allowed`): the calls relaying makes, some with
//!   their arguments held to what linnet passes; anything else traps.
//!
//! The list is in docs/security.md ("Relays under seccomp"), checked
//! against this one by a unit test.

use std::collections::BTreeMap;
use std::io::Write as _;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule,
};

/// What the process does besides relaying, each of which needs calls of
/// its own.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Needs {
    /// Removes the socket file it bound for the VMM when it stops.
    pub socket_file: bool,
    /// Passes signals on to its VMM, this process.
    pub signals_to: Option<libc::pid_t>,
    /// Runs a vhost-user back-end (datapath/vhost_user/); a back-end for
    /// each VMM connection is reached through the process's connector.
    pub vhost_user: bool,
}

/// An allowed call: its name (for the docs' test), number and rules.
#[cfg_attr(not(test), allow(dead_code))] // `name`: the docs test
struct Allowed {
    name: &'static str,
    number: libc::c_long,
    /// The conditions of each rule; none: any arguments.
    rules: Vec<Vec<SeccompCondition>>,
}

#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    #[error("cannot build the seccomp filter: {0}")]
    Build(#[from] seccompiler::BackendError),
    #[error("cannot install the seccomp filter: {0}")]
    Install(#[from] seccompiler::Error),
    #[error("cannot install the handler of forbidden calls: {0}")]
    Handler(std::io::Error),
    #[error("cannot start a thread: {0}")]
    FirstThread(std::io::Error),
}

/// Confines the calling process, all its threads, from here on. `who`
/// names it in the line a forbidden call leaves on stderr.
pub fn confine(who: &'static str, needs: Needs) -> Result<(), SeccompError> {
    install(who, allow_list(needs)?)
}

/// Confines `linnet-gate` (one thread, one socket it was given): its own
/// list, `gate_allowed`.
pub fn confine_gate(who: &'static str) -> Result<(), SeccompError> {
    install(who, list_of(gate_allowed()?)?)
}

/// Confines `linnet-secrets` (one thread, a tokio runtime): its own
/// list, `secrets_allowed`.
pub fn confine_secrets(who: &'static str) -> Result<(), SeccompError> {
    install(who, list_of(secrets_allowed()?)?)
}

fn install(who: &'static str, list: BpfProgram) -> Result<(), SeccompError> {
    let clone3 = no_clone3()?;
    install_handler(who)?;
    // glibc sets its threads' signal handlers (SIGCANCEL, SIGSETXID) up
    // as the process starts its first thread: one started here does that
    // while sigaction is still allowed.
    let _ = std::thread::Builder::new()
        .spawn(|| {})
        .map_err(SeccompError::FirstThread)?
        .join();
    // glibc's malloc reads /proc/sys/vm/overcommit_memory (openat) the
    // first time it shrinks the heap of a thread's arena: when a thread
    // ends having freed enough (a lifeline's re-claiming thread, after a
    // daemon restart), long after confining, where openat is forbidden
    // and the relay would be stopped. A confined process's heaps are
    // small: they are never trimmed, so that never happens.
    // SAFETY: mallopt with integer parameters.
    unsafe { libc::mallopt(libc::M_TRIM_THRESHOLD, libc::c_int::MAX) };
    let probe = forbidden_call_probe();
    seccompiler::apply_filter_all_threads(&clone3)?;
    seccompiler::apply_filter_all_threads(&list)?;
    forbidden_call_for_tests(probe);
    Ok(())
}

/// The environment variable that makes a debug build's confined process
/// attempt a forbidden call right after confining itself: the tests'
/// way to see one stopped. Release builds do not look at it. `socket`:
/// a unix socket (what a lifeline once made itself); `connect:PATH`: a
/// connect to PATH, on a unix socket made before confining; anything else:
/// a socket to the world.
#[cfg(debug_assertions)]
pub const TEST_FORBIDDEN_CALL: &str = "LINNET_TEST_FORBIDDEN_CALL";

/// With the hook set to `connect:PATH`: the socket and the path, made
/// before the filter.
fn forbidden_call_probe() -> Option<(libc::c_int, std::ffi::CString)> {
    #[cfg(debug_assertions)]
    {
        let value = std::env::var(TEST_FORBIDDEN_CALL).ok()?;
        let path = std::ffi::CString::new(value.strip_prefix("connect:")?).ok()?;
        // SAFETY: socket(2) with integer arguments.
        let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0) };
        (fd >= 0).then_some((fd, path))
    }
    #[cfg(not(debug_assertions))]
    None
}

#[cfg_attr(not(debug_assertions), allow(unused_variables))]
fn forbidden_call_for_tests(probe: Option<(libc::c_int, std::ffi::CString)>) {
    #[cfg(debug_assertions)]
    if let Some(value) = std::env::var_os(TEST_FORBIDDEN_CALL) {
        // What a relay taken over through a guest's frames would want
        // first: a way out, to the world or to its user's sockets.
        // SAFETY: socket(2) and connect(2) on live memory.
        unsafe {
            match probe {
                Some((fd, path)) => {
                    // SAFETY: all-zero is a valid sockaddr_un.
                    let mut addr: libc::sockaddr_un = std::mem::zeroed();
                    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
                    for (to, from) in addr.sun_path.iter_mut().zip(path.as_bytes()) {
                        *to = *from as libc::c_char;
                    }
                    let len = size_of::<libc::sockaddr_un>() as libc::socklen_t;
                    libc::connect(fd, (&raw const addr).cast(), len);
                }
                None if value == "socket" => {
                    libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0);
                }
                None => {
                    libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
                }
            }
        }
    }
}

fn arch() -> seccompiler::TargetArch {
    std::env::consts::ARCH
        .try_into()
        .expect("linnet builds for an architecture seccompiler knows")
}

fn no_clone3() -> Result<BpfProgram, SeccompError> {
    let rules = BTreeMap::from([(libc::SYS_clone3, vec![])]);
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch(),
    )?;
    Ok(filter.try_into()?)
}

fn allow_list(needs: Needs) -> Result<BpfProgram, SeccompError> {
    list_of(allowed(needs)?)
}

fn list_of(calls: Vec<Allowed>) -> Result<BpfProgram, SeccompError> {
    let mut rules = BTreeMap::new();
    for call in calls {
        let rules_of_call = call
            .rules
            .into_iter()
            .map(SeccompRule::new)
            .collect::<Result<Vec<_>, _>>()?;
        // A call allowed twice (for two needs): either rule lets it
        // through; one with no rule lets every call through.
        match rules.entry(call.number) {
            std::collections::btree_map::Entry::Vacant(entry) => {
                entry.insert(rules_of_call);
            }
            std::collections::btree_map::Entry::Occupied(mut entry) => {
                let known: &mut Vec<SeccompRule> = entry.get_mut();
                if known.is_empty() || rules_of_call.is_empty() {
                    known.clear();
                } else {
                    known.extend(rules_of_call);
                }
            }
        }
    }
    let filter = SeccompFilter::new(rules, SeccompAction::Trap, SeccompAction::Allow, arch())?;
    Ok(filter.try_into()?)
}

/// Argument `index` equals `value`.
fn eq(index: u8, value: u64) -> Result<SeccompCondition, seccompiler::BackendError> {
    SeccompCondition::new(index, SeccompCmpArgLen::Qword, SeccompCmpOp::Eq, value)
}

/// Argument `index` (32 bits) has none of `bits`.
fn without(index: u8, bits: u64) -> Result<SeccompCondition, seccompiler::BackendError> {
    SeccompCondition::new(
        index,
        SeccompCmpArgLen::Dword,
        SeccompCmpOp::MaskedEq(bits),
        0,
    )
}

/// Argument `index` (32 bits) has all of `bits`.
fn with(index: u8, bits: u64) -> Result<SeccompCondition, seccompiler::BackendError> {
    SeccompCondition::new(
        index,
        SeccompCmpArgLen::Dword,
        SeccompCmpOp::MaskedEq(bits),
        bits,
    )
}

/// Argument `index` (32 bits) is one of `values`: a rule each.
fn one_of(
    index: u8,
    values: &[u64],
) -> Result<Vec<Vec<SeccompCondition>>, seccompiler::BackendError> {
    values
        .iter()
        .map(|&v| {
            SeccompCondition::new(index, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, v)
                .map(|c| vec![c])
        })
        .collect()
}

/// socket(2) for a unix socket of `kind` only (its flags aside).
fn unix_socket(kind: libc::c_int) -> Result<Vec<Vec<SeccompCondition>>, seccompiler::BackendError> {
    Ok(vec![vec![
        eq(0, libc::AF_UNIX as u64)?,
        SeccompCondition::new(
            1,
            SeccompCmpArgLen::Dword,
            SeccompCmpOp::MaskedEq(0xf),
            kind as u64,
        )?,
    ]])
}

/// An allowed call by its name, with the rules on its arguments.
/// `SOL_SOCKET`'s options `names` (arguments 1 and 2 of set/getsockopt):
/// a rule each.
fn socket_options(
    names: &[libc::c_int],
) -> Result<Vec<Vec<SeccompCondition>>, seccompiler::BackendError> {
    names
        .iter()
        .map(|&name| Ok(vec![eq(1, libc::SOL_SOCKET as u64)?, eq(2, name as u64)?]))
        .collect()
}

macro_rules! call {
    ($name:ident) => {
        call!($name, vec![])
    };
    ($name:ident, $rules:expr) => {
        Allowed {
            name: stringify!($name),
            number: sys::$name,
            rules: $rules,
        }
    };
}

/// The calls' numbers by their names (libc's `SYS_` constants).
#[allow(non_upper_case_globals)]
mod sys {
    macro_rules! numbers {
        ($($name:ident = $sys:ident),* $(,)?) => {
            $(pub const $name: libc::c_long = libc::$sys;)*
        };
    }
    numbers! {
        read = SYS_read, write = SYS_write, readv = SYS_readv, writev = SYS_writev,
        recvmsg = SYS_recvmsg, sendmsg = SYS_sendmsg, recvmmsg = SYS_recvmmsg,
        sendmmsg = SYS_sendmmsg, recvfrom = SYS_recvfrom, sendto = SYS_sendto,
        epoll_create1 = SYS_epoll_create1, epoll_ctl = SYS_epoll_ctl,
        epoll_pwait = SYS_epoll_pwait, ppoll = SYS_ppoll, close = SYS_close,
        fcntl = SYS_fcntl, accept4 = SYS_accept4, setsockopt = SYS_setsockopt,
        getsockopt = SYS_getsockopt, ioctl = SYS_ioctl, mmap = SYS_mmap,
        mprotect = SYS_mprotect, munmap = SYS_munmap, mremap = SYS_mremap,
        brk = SYS_brk, madvise = SYS_madvise, futex = SYS_futex,
        sched_yield = SYS_sched_yield, clone = SYS_clone, clone3 = SYS_clone3,
        set_robust_list = SYS_set_robust_list, rseq = SYS_rseq,
        sigaltstack = SYS_sigaltstack, rt_sigaction = SYS_rt_sigaction,
        rt_sigprocmask = SYS_rt_sigprocmask,
        rt_sigreturn = SYS_rt_sigreturn, rt_sigtimedwait = SYS_rt_sigtimedwait,
        sched_getaffinity = SYS_sched_getaffinity, prctl = SYS_prctl,
        getrandom = SYS_getrandom, getpid = SYS_getpid, gettid = SYS_gettid,
        tgkill = SYS_tgkill, clock_gettime = SYS_clock_gettime,
        clock_nanosleep = SYS_clock_nanosleep, nanosleep = SYS_nanosleep,
        restart_syscall = SYS_restart_syscall, wait4 = SYS_wait4, exit = SYS_exit,
        exit_group = SYS_exit_group, socket = SYS_socket, connect = SYS_connect,
        eventfd2 = SYS_eventfd2, shutdown = SYS_shutdown,
        unlinkat = SYS_unlinkat, openat = SYS_openat, renameat2 = SYS_renameat2,
        kill = SYS_kill, getsockname = SYS_getsockname, getpeername = SYS_getpeername,
    }
    // The calls glibc makes on x86_64 where newer architectures have only
    // the general one (`poll` is `ppoll` there, and so on).
    #[cfg(target_arch = "x86_64")]
    numbers! {
        epoll_wait = SYS_epoll_wait, poll = SYS_poll, unlink = SYS_unlink,
        rename = SYS_rename, renameat = SYS_renameat, rmdir = SYS_rmdir,
    }
}

/// Every allowed call. Why each is there is in docs/security.md; the
/// comments here say only what holds its arguments.
fn allowed(needs: Needs) -> Result<Vec<Allowed>, seccompiler::BackendError> {
    use linnet_tun::{TUNSETOFFLOAD, TUNSETVNETHDRSZ};
    let pid = std::process::id() as u64;
    let mut calls = vec![
        // Frames, the daemon's messages, log lines.
        call!(read),
        call!(write),
        call!(readv),
        call!(writev),
        call!(recvmsg),
        call!(sendmsg),
        call!(recvmmsg),
        call!(sendmmsg),
        call!(recvfrom),
        call!(sendto),
        call!(epoll_create1),
        call!(epoll_ctl),
        call!(epoll_pwait),
        call!(ppoll),
        call!(close),
        call!(
            fcntl,
            one_of(
                1,
                &[
                    libc::F_GETFD as u64,
                    libc::F_SETFD as u64,
                    libc::F_GETFL as u64,
                    libc::F_SETFL as u64,
                ],
            )?
        ),
        // A VMM connecting again to the socket the relay bound.
        call!(accept4),
        call!(
            setsockopt,
            socket_options(&[libc::SO_SNDBUF, libc::SO_RCVBUF])?
        ),
        call!(
            getsockopt,
            socket_options(&[libc::SO_TYPE, libc::SO_SNDBUF])?
        ),
        // The TAP's offloads and header, for a network socket's VM.
        call!(ioctl, one_of(1, &[TUNSETOFFLOAD, TUNSETVNETHDRSZ])?),
        // Memory: never executable.
        call!(mmap, vec![vec![without(2, libc::PROT_EXEC as u64)?]]),
        call!(mprotect, vec![vec![without(2, libc::PROT_EXEC as u64)?]]),
        call!(munmap),
        call!(mremap),
        call!(brk),
        call!(madvise),
        // Threads: only threads (no new process, no namespace).
        call!(futex),
        call!(sched_yield),
        call!(
            clone,
            vec![vec![
                with(0, libc::CLONE_THREAD as u64)?,
                without(
                    0,
                    (libc::CLONE_NEWNS
                        | libc::CLONE_NEWUSER
                        | libc::CLONE_NEWNET
                        | libc::CLONE_NEWPID
                        | libc::CLONE_NEWIPC
                        | libc::CLONE_NEWUTS
                        | libc::CLONE_NEWCGROUP) as u64,
                )?,
            ]]
        ),
        // Refused by the first filter with ENOSYS; let through here so
        // that answer stands.
        call!(clone3),
        call!(set_robust_list),
        call!(rseq),
        call!(sigaltstack),
        // Asking only, never setting: a new thread asks std's stack
        // overflow handler whether SIGSEGV's is in place.
        call!(rt_sigaction, vec![vec![eq(1, 0)?]]),
        call!(rt_sigprocmask),
        call!(rt_sigreturn),
        call!(rt_sigtimedwait),
        call!(sched_getaffinity),
        call!(prctl, vec![vec![eq(0, libc::PR_SET_NAME as u64)?]]),
        call!(getrandom),
        call!(getpid),
        call!(gettid),
        // A panic's abort, to itself only.
        call!(tgkill, vec![vec![eq(0, pid)?]]),
        call!(clock_gettime),
        call!(clock_nanosleep),
        call!(nanosleep),
        call!(restart_syscall),
        call!(wait4),
        call!(exit),
        call!(exit_group),
    ];
    #[cfg(target_arch = "x86_64")]
    calls.extend([call!(epoll_wait), call!(poll)]);
    if needs.socket_file {
        calls.push(call!(unlinkat));
        #[cfg(target_arch = "x86_64")]
        calls.push(call!(unlink));
    }
    if needs.vhost_user {
        // rust-vmm's back-end: its events, the descriptors it keeps a copy
        // of, and the private directory of its socket, removed at the end.
        calls.push(call!(eventfd2));
        calls.push(call!(shutdown));
        calls.push(call!(
            fcntl,
            vec![vec![eq(1, libc::F_DUPFD_CLOEXEC as u64)?]]
        ));
        if !needs.socket_file {
            calls.push(call!(unlinkat));
            #[cfg(target_arch = "x86_64")]
            calls.push(call!(unlink));
        }
        #[cfg(target_arch = "x86_64")]
        calls.push(call!(rmdir));
    }
    if let Some(child) = needs.signals_to {
        calls.push(call!(kill, vec![vec![eq(0, child as u64)?]]));
    }
    Ok(calls)
}

/// Every call `linnet-gate` may make: reading and writing the daemon's
/// socket (and stderr), waiting on it, memory, time, and what a Rust
/// program does to end or abort. No socket, no file, no thread.
fn gate_allowed() -> Result<Vec<Allowed>, seccompiler::BackendError> {
    let pid = std::process::id() as u64;
    let mut calls = vec![
        call!(read),
        call!(write),
        call!(recvfrom),
        call!(sendto),
        call!(recvmsg),
        call!(sendmsg),
        call!(ppoll),
        call!(close),
        call!(mmap, vec![vec![without(2, libc::PROT_EXEC as u64)?]]),
        call!(mprotect, vec![vec![without(2, libc::PROT_EXEC as u64)?]]),
        call!(munmap),
        call!(mremap),
        call!(brk),
        call!(madvise),
        call!(futex),
        call!(sigaltstack),
        call!(rt_sigaction, vec![vec![eq(1, 0)?]]),
        call!(rt_sigprocmask),
        call!(rt_sigreturn),
        call!(getrandom),
        call!(getpid),
        call!(gettid),
        call!(tgkill, vec![vec![eq(0, pid)?]]),
        call!(clock_gettime),
        call!(restart_syscall),
        call!(exit),
        call!(exit_group),
    ];
    #[cfg(target_arch = "x86_64")]
    calls.push(call!(poll));
    Ok(calls)
}

/// The secrets proxy's list: the gate's, and what serving TCP takes:
/// accepting on the socket it was given, IPv4 and IPv6 stream sockets to
/// dial upstreams, their options, and the runtime's epoll.
fn secrets_allowed() -> Result<Vec<Allowed>, seccompiler::BackendError> {
    let mut calls = gate_allowed()?;
    let stream = |family: libc::c_int| -> Result<Vec<SeccompCondition>, seccompiler::BackendError> {
        Ok(vec![
            eq(0, family as u64)?,
            SeccompCondition::new(
                1,
                SeccompCmpArgLen::Dword,
                SeccompCmpOp::MaskedEq(0xf),
                libc::SOCK_STREAM as u64,
            )?,
        ])
    };
    calls.extend([
        call!(
            socket,
            vec![stream(libc::AF_INET)?, stream(libc::AF_INET6)?]
        ),
        call!(connect),
        call!(accept4),
        call!(getsockopt),
        call!(setsockopt),
        call!(getsockname),
        call!(getpeername),
        call!(shutdown),
        call!(readv),
        call!(writev),
        call!(epoll_ctl),
        call!(epoll_wait),
        call!(epoll_pwait),
        call!(fcntl),
        call!(sched_yield),
        // Sockets made non-blocking (std's set_nonblocking), nothing else.
        call!(ioctl, vec![vec![eq(1, libc::FIONBIO)?]]),
    ]);
    Ok(calls)
}

/// The connector's filter (`cli::connector`), built before it forks: its
/// pair (read a request, send an answer), unix sockets of the two kinds it
/// connects, `connect`, the file it writes and renames, `close`, exit.
/// Anything else kills it.
pub fn connector_filter() -> Result<BpfProgram, SeccompError> {
    let mut socket_rules = unix_socket(libc::SOCK_SEQPACKET)?;
    socket_rules.extend(unix_socket(libc::SOCK_STREAM)?);
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut calls = vec![
        call!(recvfrom),
        call!(sendmsg),
        call!(socket, socket_rules),
        call!(connect),
        call!(openat),
        call!(write),
        call!(renameat2),
        call!(close),
        call!(exit),
        call!(exit_group),
    ];
    #[cfg(target_arch = "x86_64")]
    calls.extend([call!(rename), call!(renameat)]);
    let rules = calls
        .into_iter()
        .map(|call| {
            let rules = call
                .rules
                .into_iter()
                .map(SeccompRule::new)
                .collect::<Result<Vec<_>, _>>()?;
            Ok((call.number, rules))
        })
        .collect::<Result<BTreeMap<_, _>, seccompiler::BackendError>>()?;
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::KillProcess,
        SeccompAction::Allow,
        arch(),
    )?;
    Ok(filter.try_into()?)
}

/// Who the handler speaks for, set once before the filter.
static WHO: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();

/// Exit status after a forbidden call: as if killed by SIGSYS.
const EXIT_FORBIDDEN: i32 = 128 + libc::SIGSYS;

fn install_handler(who: &'static str) -> Result<(), SeccompError> {
    let _ = WHO.set(who);
    // SAFETY: a zeroed sigaction with a handler that makes only
    // async-signal-safe calls (write, _exit).
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_forbidden_call as *const () as usize;
        action.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut action.sa_mask);
        if libc::sigaction(libc::SIGSYS, &action, std::ptr::null_mut()) < 0 {
            return Err(SeccompError::Handler(std::io::Error::last_os_error()));
        }
        // The relay blocks its stop signals; SIGSYS must never be.
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGSYS);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
    }
    Ok(())
}

/// SIGSYS from the filter: says which call and stops the process. No
/// allocation, no lock: a fixed buffer and write(2).
extern "C" fn on_forbidden_call(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo; for SIGSYS its union
    // holds the call's address, then its number (an int), at offset 16.
    let number = unsafe { *((info as *const u8).add(16 + size_of::<usize>()) as *const i32) };
    // SAFETY: as above: the call's address, at offset 16.
    let at = unsafe { *((info as *const u8).add(16) as *const usize) };
    // Where this handler is, for `addr2line` to place `at` in a
    // position-independent executable.
    let handler = on_forbidden_call as *const () as usize;
    let mut line = [0u8; 384];
    let mut cursor = std::io::Cursor::new(&mut line[..]);
    let _ = writeln!(
        cursor,
        "{}: stopped: it made system call {number}, which its seccomp filter does not allow (docs/security.md lists what each of linnet's confined processes may call); what it served goes with it (the call at {at:#x}, this handler at {handler:#x})",
        WHO.get().copied().unwrap_or("linnet")
    );
    let len = cursor.position() as usize;
    // SAFETY: write and _exit are async-signal-safe.
    unsafe {
        libc::write(libc::STDERR_FILENO, line.as_ptr().cast(), len);
        libc::_exit(EXIT_FORBIDDEN);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every_need() -> Needs {
        Needs {
            socket_file: true,
            signals_to: Some(42),
            vhost_user: true,
        }
    }

    #[test]
    fn the_filters_compile_for_every_need() {
        for needs in [Needs::default(), every_need()] {
            assert!(!allow_list(needs).unwrap().is_empty());
        }
        assert!(!no_clone3().unwrap().is_empty());
        assert!(!connector_filter().unwrap().is_empty());
    }

    #[test]
    fn what_a_process_needs_besides_relaying_is_allowed_only_when_it_needs_it() {
        let names =
            |needs| -> Vec<&str> { allowed(needs).unwrap().iter().map(|c| c.name).collect() };
        let bare = names(Needs::default());
        for call in ["unlinkat", "kill", "eventfd2", "shutdown"] {
            assert!(!bare.contains(&call), "{call} allowed with no need of it");
            assert!(names(every_need()).contains(&call), "{call} never allowed");
        }
        // No socket of its own, whatever it needs: its connector
        // connects for it.
        for call in [
            "socket",
            "connect",
            "socketpair",
            "execve",
            "ptrace",
            "bind",
            "listen",
            "setns",
            "unshare",
            "mount",
        ] {
            assert!(!names(every_need()).contains(&call), "{call} allowed");
        }
    }

    #[test]
    fn the_gate_may_open_nothing_and_start_nothing() {
        let names: Vec<&str> = gate_allowed().unwrap().iter().map(|c| c.name).collect();
        for call in [
            "socket", "connect", "accept4", "openat", "clone", "execve", "kill", "ioctl",
        ] {
            assert!(!names.contains(&call), "{call} allowed to the gate");
        }
        assert!(!list_of(gate_allowed().unwrap()).unwrap().is_empty());
        let docs = include_str!("../../docs/security.md");
        let section = docs
            .split("## The gate under seccomp")
            .nth(1)
            .expect("docs/security.md has a section \"The gate under seccomp\"");
        let section = section.split("\n## ").next().unwrap();
        for name in names {
            assert!(
                section.contains(&format!("`{name}`")),
                "docs/security.md's gate section does not name `{name}`"
            );
        }
    }

    #[test]
    fn the_secrets_proxy_may_dial_tcp_and_open_nothing() {
        let names: Vec<&str> = secrets_allowed().unwrap().iter().map(|c| c.name).collect();
        for call in [
            "openat",
            "clone",
            "execve",
            "kill",
            "wait4",
            "unlinkat",
            "renameat2",
        ] {
            assert!(
                !names.contains(&call),
                "{call} allowed to the secrets proxy"
            );
        }
        assert!(!list_of(secrets_allowed().unwrap()).unwrap().is_empty());
        let docs = include_str!("../../docs/security.md");
        let section = docs
            .split("## The secrets proxy under seccomp")
            .nth(1)
            .expect("docs/security.md has a section \"The secrets proxy under seccomp\"");
        let section = section.split("\n## ").next().unwrap();
        for name in names {
            assert!(
                section.contains(&format!("`{name}`")),
                "docs/security.md's secrets proxy section does not name `{name}`"
            );
        }
    }

    #[test]
    fn the_docs_list_every_allowed_call() {
        let docs = include_str!("../../docs/security.md");
        let section = docs
            .split("## Relays under seccomp")
            .nth(1)
            .expect("docs/security.md has a section \"Relays under seccomp\"");
        let section = section.split("\n## ").next().unwrap();
        for call in allowed(every_need()).unwrap() {
            let name = call.name;
            assert!(
                section.contains(&format!("`{name}`")),
                "docs/security.md does not say why `{name}` is allowed"
            );
        }
    }
}

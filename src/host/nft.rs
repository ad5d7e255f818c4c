//! Runs nftables commands (JSON in, JSON out) through libnftables in the
//! daemon's own process: the same parser and checks as the `nft` command,
//! without a process per change. That keeps guarding an interface at attach
//! well under a millisecond instead of the ~4 ms an `nft` process costs.
//! Falls back to the `nft` command when the library cannot be loaded.

use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use libloading::Library;
use nftables::schema::Nftables;
use thiserror::Error;
use tracing::debug;

const LIBRARY: &str = "libnftables.so.1";
/// NFT_CTX_OUTPUT_JSON in libnftables.h: JSON output, and JSON input too.
const OUTPUT_JSON: c_uint = 1 << 4;
/// NFT_CTX_OUTPUT_TERSE: listings without set elements.
const OUTPUT_TERSE: c_uint = 1 << 11;

#[derive(Debug, Error)]
pub enum NftError {
    #[error("nft is not installed: install the nftables package (apt-get install nftables)")]
    Missing,
    #[error("nftables refused linnet's rules: {0}")]
    Refused(String),
}

type CtxNew = unsafe extern "C" fn(c_uint) -> *mut c_void;
type CtxFree = unsafe extern "C" fn(*mut c_void);
type SetFlags = unsafe extern "C" fn(*mut c_void, c_uint);
type Buffer = unsafe extern "C" fn(*mut c_void) -> c_int;
type GetBuffer = unsafe extern "C" fn(*mut c_void) -> *const c_char;
type RunCmd = unsafe extern "C" fn(*mut c_void, *const c_char) -> c_int;

/// An open libnftables context and the functions that use it.
struct Context {
    ctx: *mut c_void,
    free: CtxFree,
    set_flags: SetFlags,
    run: RunCmd,
    output: GetBuffer,
    error: GetBuffer,
    /// Keeps the code above mapped; dropped last.
    _library: Library,
}

// SAFETY: a context may move between threads as long as one call runs at a
// time, which the Mutex in `Nft` ensures. (libnftables also has process-wide
// state, so the daemon keeps a single `Nft`, whose clones share it.)
unsafe impl Send for Context {}

impl Context {
    fn open() -> Result<Context, ContextError> {
        // SAFETY: loading libnftables runs no initialisers with preconditions.
        let library = unsafe { Library::new(LIBRARY) }?;
        // SAFETY: the symbols have these C signatures (libnftables.h); the
        // pointers stay valid while `library` is loaded, which `Context` keeps.
        unsafe {
            let new: CtxNew = *library.get(b"nft_ctx_new\0")?;
            let free: CtxFree = *library.get(b"nft_ctx_free\0")?;
            let set_flags: SetFlags = *library.get(b"nft_ctx_output_set_flags\0")?;
            let buffer_output: Buffer = *library.get(b"nft_ctx_buffer_output\0")?;
            let buffer_error: Buffer = *library.get(b"nft_ctx_buffer_error\0")?;
            let run: RunCmd = *library.get(b"nft_run_cmd_from_buffer\0")?;
            let output: GetBuffer = *library.get(b"nft_ctx_get_output_buffer\0")?;
            let error: GetBuffer = *library.get(b"nft_ctx_get_error_buffer\0")?;
            let ctx = new(0);
            if ctx.is_null() {
                return Err(ContextError::Null);
            }
            set_flags(ctx, OUTPUT_JSON);
            if buffer_output(ctx) != 0 || buffer_error(ctx) != 0 {
                free(ctx);
                return Err(ContextError::Buffers);
            }
            Ok(Context {
                ctx,
                free,
                set_flags,
                run,
                output,
                error,
                _library: library,
            })
        }
    }

    /// Runs `command` with the terse flag on (no set elements listed).
    fn run_terse(&mut self, command: &str) -> Result<String, NftError> {
        // SAFETY: ctx is live; flags are plain bits.
        unsafe { (self.set_flags)(self.ctx, OUTPUT_JSON | OUTPUT_TERSE) };
        let out = self.run(command);
        // SAFETY: as above.
        unsafe { (self.set_flags)(self.ctx, OUTPUT_JSON) };
        out
    }

    fn run(&mut self, command: &str) -> Result<String, NftError> {
        let text = CString::new(command).map_err(|e| NftError::Refused(e.to_string()))?;
        // SAFETY: ctx is live; the buffers are owned by it and read before
        // the next call replaces them.
        unsafe {
            let rc = (self.run)(self.ctx, text.as_ptr());
            let read = |p: *const c_char| {
                if p.is_null() {
                    String::new()
                } else {
                    CStr::from_ptr(p).to_string_lossy().into_owned()
                }
            };
            // Both buffers are read every time, so warnings of one call do
            // not turn up in the next one's error.
            let output = read((self.output)(self.ctx));
            let error = read((self.error)(self.ctx));
            if rc == 0 {
                Ok(output)
            } else {
                Err(NftError::Refused(error.trim().to_string()))
            }
        }
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: ctx came from nft_ctx_new and is freed once.
        unsafe { (self.free)(self.ctx) }
    }
}

#[derive(Debug, Error)]
enum ContextError {
    #[error(transparent)]
    Load(#[from] libloading::Error),
    #[error("nft_ctx_new failed")]
    Null,
    #[error("cannot buffer libnftables' output")]
    Buffers,
}

/// The way to nftables: the library when it loads, else the command.
/// Clones share one context (the DNS forwarder's learned addresses and
/// the daemon's tables go through the same).
#[derive(Clone)]
pub struct Nft {
    context: Option<Arc<Mutex<Context>>>,
}

impl Nft {
    pub fn open() -> Nft {
        let context = match Context::open() {
            Ok(c) => Some(Arc::new(Mutex::new(c))),
            Err(e) => {
                debug!("{LIBRARY} not usable ({e}); running the nft command instead");
                None
            }
        };
        Nft { context }
    }

    /// Applies a batch of commands as one transaction.
    pub fn apply(&self, doc: &Nftables) -> Result<(), NftError> {
        let json = serde_json::to_string(doc).map_err(|e| NftError::Refused(e.to_string()))?;
        self.run(&json).map(|_| ())
    }

    /// Runs one command (JSON or nft syntax) and returns its JSON output.
    pub fn run(&self, command: &str) -> Result<String, NftError> {
        match &self.context {
            Some(context) => context.lock().expect("not poisoned").run(command),
            None => run_command(command, false),
        }
    }

    /// A listing without set elements (which can be large: others' block
    /// lists, linnet's own guard sets).
    pub fn list_terse(&self, command: &str) -> Result<String, NftError> {
        match &self.context {
            Some(context) => context.lock().expect("not poisoned").run_terse(command),
            None => run_command(command, true),
        }
    }
}

fn run_command(command: &str, terse: bool) -> Result<String, NftError> {
    let flags: &[&str] = if terse { &["-j", "-t"] } else { &["-j"] };
    let mut child = Command::new("nft")
        .args(flags)
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => NftError::Missing,
            _ => NftError::Refused(format!("cannot run nft: {e}")),
        })?;
    let written = child
        .stdin
        .take()
        .expect("piped")
        .write_all(command.as_bytes());
    let out = child
        .wait_with_output()
        .map_err(|e| NftError::Refused(format!("nft: {e}")))?;
    if let Err(e) = written {
        return Err(NftError::Refused(format!("nft: {e}")));
    }
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(NftError::Refused(
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ))
    }
}

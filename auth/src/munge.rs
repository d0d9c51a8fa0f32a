//! `auth/munge`: credentials from a site's existing munged.
//!
//! For sites that already run MUNGE (Slurm's default), Docket can use it instead of its own
//! signer: the client asks the local munged for a credential (`munge_encode`), the controller
//! asks its own munged to decode it (`munge_decode`), which checks the MAC, the lifetime and
//! replays, and yields the uid and gid munged vouches for. The controller then resolves the
//! uid to a name in its own user database, as slurmctld does.
//!
//! libmunge is loaded at run time (`dlopen("libmunge.so.2")`), only when `auth/munge` is
//! chosen, so Docket builds and runs without it installed.

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::path::{Path, PathBuf};

use crate::credential::CredentialError;

type Ctx = *mut c_void;
type EncodeFn = unsafe extern "C" fn(*mut *mut c_char, Ctx, *const c_void, c_int) -> c_int;
type DecodeFn = unsafe extern "C" fn(
    *const c_char,
    Ctx,
    *mut *mut c_void,
    *mut c_int,
    *mut nix::libc::uid_t,
    *mut nix::libc::gid_t,
) -> c_int;
type CtxCreateFn = unsafe extern "C" fn() -> Ctx;
type CtxDestroyFn = unsafe extern "C" fn(Ctx);
type CtxSetFn = unsafe extern "C" fn(Ctx, c_int, ...) -> c_int;
type CtxStrerrorFn = unsafe extern "C" fn(Ctx) -> *const c_char;

/// munge.h: `MUNGE_OPT_SOCKET`.
const MUNGE_OPT_SOCKET: c_int = 8;
/// munge.h: error numbers the verifier maps to its own.
const EMUNGE_SUCCESS: c_int = 0;
const EMUNGE_CRED_INVALID: c_int = 14;
const EMUNGE_CRED_EXPIRED: c_int = 15;
const EMUNGE_CRED_REWOUND: c_int = 16;
const EMUNGE_CRED_REPLAYED: c_int = 17;

/// Longest MUNGE credential accepted (a payload-free one is about 120 bytes).
pub const MAX_MUNGE_CREDENTIAL_BYTES: usize = 4096;

/// Why munge could not be used.
#[derive(Debug, thiserror::Error)]
pub enum MungeError {
    #[error(
        "auth/munge: cannot load libmunge.so.2 ({0}); install MUNGE (Debian: apt-get install \
         munge) or use auth/docket"
    )]
    Load(String),
    #[error("auth/munge: {0}")]
    Call(String),
    #[error(transparent)]
    Credential(#[from] CredentialError),
}

/// libmunge, loaded.
pub struct Munge {
    _lib: libloading::Library,
    encode: EncodeFn,
    decode: DecodeFn,
    ctx_create: CtxCreateFn,
    ctx_destroy: CtxDestroyFn,
    ctx_set: CtxSetFn,
    ctx_strerror: CtxStrerrorFn,
    socket: Option<CString>,
}

impl std::fmt::Debug for Munge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Munge")
            .field("socket", &self.socket)
            .finish_non_exhaustive()
    }
}

/// What munged vouches for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MungeIdentity {
    pub uid: u32,
    pub gid: u32,
}

/// One munge context, destroyed on drop.
struct Context<'a> {
    munge: &'a Munge,
    ctx: Ctx,
}

impl Drop for Context<'_> {
    fn drop(&mut self) {
        // SAFETY: `ctx` came from munge_ctx_create and is destroyed once, here.
        unsafe { (self.munge.ctx_destroy)(self.ctx) }
    }
}

impl Munge {
    /// Loads libmunge; `socket` is munged's socket (None: libmunge's default,
    /// `/run/munge/munge.socket.2` on Debian).
    pub fn load(socket: Option<&Path>) -> Result<Munge, MungeError> {
        // SAFETY: loading libmunge runs its initializers, which have no preconditions.
        let lib = unsafe { libloading::Library::new("libmunge.so.2") }
            .map_err(|e| MungeError::Load(e.to_string()))?;
        fn symbol<T: Copy>(lib: &libloading::Library, name: &[u8]) -> Result<T, MungeError> {
            // SAFETY: every caller names a libmunge function with the type munge.h declares.
            unsafe { lib.get::<T>(name) }
                .map(|s| *s)
                .map_err(|e| MungeError::Load(e.to_string()))
        }
        let encode = symbol::<EncodeFn>(&lib, b"munge_encode\0")?;
        let decode = symbol::<DecodeFn>(&lib, b"munge_decode\0")?;
        let ctx_create = symbol::<CtxCreateFn>(&lib, b"munge_ctx_create\0")?;
        let ctx_destroy = symbol::<CtxDestroyFn>(&lib, b"munge_ctx_destroy\0")?;
        let ctx_set = symbol::<CtxSetFn>(&lib, b"munge_ctx_set\0")?;
        let ctx_strerror = symbol::<CtxStrerrorFn>(&lib, b"munge_ctx_strerror\0")?;
        let socket = socket
            .map(|p| {
                CString::new(p.as_os_str().as_encoded_bytes())
                    .map_err(|_| MungeError::Call("the socket path has a NUL byte".into()))
            })
            .transpose()?;
        Ok(Munge {
            _lib: lib,
            encode,
            decode,
            ctx_create,
            ctx_destroy,
            ctx_set,
            ctx_strerror,
            socket,
        })
    }

    fn context(&self) -> Result<Context<'_>, MungeError> {
        // SAFETY: no preconditions; a null result is handled.
        let ctx = unsafe { (self.ctx_create)() };
        if ctx.is_null() {
            return Err(MungeError::Call(
                "cannot create a context (out of memory)".into(),
            ));
        }
        let context = Context { munge: self, ctx };
        if let Some(socket) = &self.socket {
            // SAFETY: MUNGE_OPT_SOCKET takes a `char *` that libmunge copies.
            let rc = unsafe { (self.ctx_set)(ctx, MUNGE_OPT_SOCKET, socket.as_ptr()) };
            if rc != EMUNGE_SUCCESS {
                return Err(MungeError::Call(context.error(rc)));
            }
        }
        Ok(context)
    }

    /// A credential for this process (no payload).
    pub fn encode(&self) -> Result<String, MungeError> {
        let context = self.context()?;
        let mut cred: *mut c_char = std::ptr::null_mut();
        // SAFETY: `cred` receives a malloc'd C string that we free below; no payload.
        let rc = unsafe { (self.encode)(&mut cred, context.ctx, std::ptr::null(), 0) };
        if rc != EMUNGE_SUCCESS {
            return Err(MungeError::Call(context.error(rc)));
        }
        if cred.is_null() {
            return Err(MungeError::Call(
                "munge_encode returned no credential".into(),
            ));
        }
        // SAFETY: libmunge returned a NUL-terminated string it allocated with malloc.
        let text = unsafe { CStr::from_ptr(cred) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: freed once, with the allocator that made it.
        unsafe { nix::libc::free(cred.cast()) };
        Ok(text)
    }

    /// Checks `credential` with munged and returns the uid and gid it vouches for.
    pub fn decode(&self, credential: &str) -> Result<MungeIdentity, MungeError> {
        if credential.len() > MAX_MUNGE_CREDENTIAL_BYTES {
            return Err(CredentialError::TooLarge {
                bytes: credential.len(),
            }
            .into());
        }
        if !credential.starts_with("MUNGE:") {
            return Err(CredentialError::Malformed("no \"MUNGE:\" prefix".into()).into());
        }
        let text = CString::new(credential)
            .map_err(|_| CredentialError::Malformed("a NUL byte".into()))?;
        let context = self.context()?;
        let mut payload: *mut c_void = std::ptr::null_mut();
        let mut len: c_int = 0;
        let mut uid: nix::libc::uid_t = 0;
        let mut gid: nix::libc::gid_t = 0;
        // SAFETY: every out-pointer is live; a payload munge returns is freed below.
        let rc = unsafe {
            (self.decode)(
                text.as_ptr(),
                context.ctx,
                &mut payload,
                &mut len,
                &mut uid,
                &mut gid,
            )
        };
        if !payload.is_null() {
            // SAFETY: malloc'd by libmunge, freed once.
            unsafe { nix::libc::free(payload) };
        }
        match rc {
            EMUNGE_SUCCESS => Ok(MungeIdentity { uid, gid }),
            EMUNGE_CRED_REPLAYED => Err(CredentialError::Replayed.into()),
            EMUNGE_CRED_EXPIRED => Err(CredentialError::Expired { ago_ms: 0 }.into()),
            EMUNGE_CRED_REWOUND => Err(CredentialError::FromTheFuture { ahead_ms: 0 }.into()),
            EMUNGE_CRED_INVALID => Err(CredentialError::BadSignature.into()),
            other => Err(MungeError::Call(context.error(other))),
        }
    }

    /// munged's socket, if set.
    pub fn socket(&self) -> Option<PathBuf> {
        self.socket
            .as_ref()
            .map(|s| PathBuf::from(s.to_string_lossy().into_owned()))
    }
}

impl Context<'_> {
    fn error(&self, rc: c_int) -> String {
        // SAFETY: the context is live; munge returns a static or context-owned string.
        let text = unsafe { (self.munge.ctx_strerror)(self.ctx) };
        if text.is_null() {
            format!("munge error {rc}")
        } else {
            // SAFETY: NUL-terminated, owned by libmunge for the context's life.
            unsafe { CStr::from_ptr(text) }
                .to_string_lossy()
                .into_owned()
        }
    }
}

// SAFETY: libmunge is thread-safe given a context per call, which is how it is used here;
// the library handle and function pointers are immutable.
unsafe impl Send for Munge {}
// SAFETY: as above.
unsafe impl Sync for Munge {}

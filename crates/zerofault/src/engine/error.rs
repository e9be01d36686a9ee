//! What can go wrong, one type per operation: starting the engine ([`StartError`]), serving a
//! range ([`MapError`]: `map`, `register`, `adopt`, `adopt_grown`) and recycling one
//! ([`RecycleError`]). Each variant says which step failed, and carries the kernel's answer.

use crate::options::OptionError;
use crate::sys::uffd::UffdError;
use std::fmt;
use std::io;

/// Why the engine could not start ([`crate::Engine::new`], `with_stats`, `from_env`).
#[derive(Debug)]
pub enum StartError {
    /// A knob had a bad value (the message names it and what it accepts).
    Options(OptionError),
    /// No userfaultfd could be opened.
    Uffd(UffdError),
    /// The system page size is not the 4 KiB the engine serves.
    PageSize(usize),
    /// Mapping the handlers' doorbell pages failed.
    Doorbells(io::Error),
    /// Registering the doorbell pages with the userfaultfd failed.
    RegisterDoorbells(io::Error),
    /// Reserving a pool's rings failed.
    Pool(io::Error),
    /// Mapping a handler's staging area (one PMD) failed.
    Staging(io::Error),
    /// Mapping the zero source of the copy path failed.
    ZeroSource(io::Error),
    /// Starting a handler or scrub thread failed.
    Thread(io::Error),
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartError::Options(e) => write!(f, "{e}"),
            StartError::Uffd(e) => write!(f, "{e}"),
            StartError::PageSize(p) => write!(f, "the page size is {p} bytes; zerofault serves 4096-byte pages"),
            StartError::Doorbells(e) => write!(f, "failed to map the handlers' doorbells: {e}"),
            StartError::RegisterDoorbells(e) => {
                write!(
                    f,
                    "failed to register the handlers' doorbells with the userfaultfd: {e}"
                )
            }
            StartError::Pool(e) => write!(f, "failed to reserve the pool: {e}"),
            StartError::Staging(e) => write!(f, "failed to map a handler's staging area: {e}"),
            StartError::ZeroSource(e) => write!(f, "failed to map the zero source: {e}"),
            StartError::Thread(e) => write!(f, "failed to start an engine thread: {e}"),
        }
    }
}

impl std::error::Error for StartError {}

impl From<OptionError> for StartError {
    fn from(e: OptionError) -> Self {
        StartError::Options(e)
    }
}

/// Why a range could not be served ([`crate::Engine::map`], `register`, `adopt`,
/// `adopt_grown`).
#[derive(Debug)]
pub enum MapError {
    /// An address or length was not page aligned (or the length was zero).
    Unaligned {
        /// The address asked for.
        addr: usize,
        /// The length asked for.
        len: usize,
    },
    /// Mapping the memory failed (`Engine::map`).
    Map(io::Error),
    /// Registering the range with the userfaultfd failed.
    Register(io::Error),
}

impl fmt::Display for MapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MapError::Unaligned { addr, len } => unaligned(f, *addr, *len),
            MapError::Map(e) => write!(f, "failed to map memory: {e}"),
            MapError::Register(e) => write!(f, "failed to register memory with the userfaultfd: {e}"),
        }
    }
}

impl std::error::Error for MapError {}

/// Why [`crate::Engine::recycle`] failed.
#[derive(Debug)]
pub enum RecycleError {
    /// The address or length was not page aligned.
    Unaligned {
        /// The address asked for.
        addr: usize,
        /// The length asked for.
        len: usize,
    },
    /// Discarding the pages not moved into the pool (`MADV_DONTNEED`) failed.
    Discard(io::Error),
}

impl fmt::Display for RecycleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecycleError::Unaligned { addr, len } => unaligned(f, *addr, *len),
            RecycleError::Discard(e) => write!(f, "failed to discard memory: {e}"),
        }
    }
}

impl std::error::Error for RecycleError {}

fn unaligned(f: &mut fmt::Formatter<'_>, addr: usize, len: usize) -> fmt::Result {
    write!(f, "range {addr:#x}+{len:#x} is not page aligned (4096 bytes)")
}

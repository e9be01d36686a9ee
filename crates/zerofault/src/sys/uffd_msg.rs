//! The messages a userfaultfd delivers: `struct uffd_msg` as read ([`RawMsg`]), its event
//! types, and its decoding into a [`Msg`].

use crate::page::index;

/// Message types (`UFFD_EVENT_*`).
const EVENT_PAGEFAULT: u8 = 0x12;
const EVENT_FORK: u8 = 0x13;
const EVENT_REMAP: u8 = 0x14;
const EVENT_REMOVE: u8 = 0x15;
const EVENT_UNMAP: u8 = 0x16;
/// `UFFD_PAGEFAULT_FLAG_WRITE`.
const PAGEFAULT_FLAG_WRITE: u64 = 1;

/// One message read from the userfaultfd.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Msg {
    /// A thread touched a missing page.
    PageFault {
        /// The address touched.
        addr: usize,
        /// A write (else a read).
        write: bool,
        /// The thread (0 without `THREAD_ID`).
        tid: u32,
    },
    /// `madvise(MADV_DONTNEED / MADV_REMOVE / MADV_FREE)` dropped `[start, end)`.
    Remove {
        /// First byte.
        start: usize,
        /// End (exclusive).
        end: usize,
    },
    /// `munmap` (or `mmap(MAP_FIXED)` over it) unmapped `[start, end)`.
    Unmap {
        /// First byte.
        start: usize,
        /// End (exclusive).
        end: usize,
    },
    /// `mremap` moved `len` bytes from `from` to `to`.
    Remap {
        /// Old address.
        from: usize,
        /// New address.
        to: usize,
        /// Bytes moved.
        len: usize,
    },
    /// A fork event (not requested; listed so that it is never mistaken for a fault).
    Fork,
    /// Anything newer than this wrapper.
    Unknown(u8),
}

/// `struct uffd_msg`: 32 bytes, the event type then a 24-byte union.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct RawMsg {
    event: u8,
    _reserved1: u8,
    _reserved2: u16,
    _reserved3: u32,
    arg: [u64; 3],
}

impl RawMsg {
    /// Decodes the union according to the event type.
    pub(crate) fn decode(&self) -> Msg {
        let [a0, a1, a2] = self.arg;
        match self.event {
            EVENT_PAGEFAULT => Msg::PageFault {
                addr: index(a1),
                write: a0 & PAGEFAULT_FLAG_WRITE != 0,
                tid: u32::try_from(a2).unwrap_or(0),
            },
            EVENT_REMOVE => Msg::Remove {
                start: index(a0),
                end: index(a1),
            },
            EVENT_UNMAP => Msg::Unmap {
                start: index(a0),
                end: index(a1),
            },
            EVENT_REMAP => Msg::Remap {
                from: index(a0),
                to: index(a1),
                len: index(a2),
            },
            EVENT_FORK => Msg::Fork,
            other => Msg::Unknown(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_decode_by_event_type() {
        let m = RawMsg {
            event: EVENT_PAGEFAULT,
            arg: [PAGEFAULT_FLAG_WRITE, 0x7000, 42],
            ..Default::default()
        };
        assert_eq!(
            m.decode(),
            Msg::PageFault {
                addr: 0x7000,
                write: true,
                tid: 42
            }
        );
        let m = RawMsg {
            event: EVENT_REMAP,
            arg: [1, 2, 3],
            ..Default::default()
        };
        assert_eq!(m.decode(), Msg::Remap { from: 1, to: 2, len: 3 });
        let m = RawMsg {
            event: EVENT_UNMAP,
            arg: [4, 8, 0],
            ..Default::default()
        };
        assert_eq!(m.decode(), Msg::Unmap { start: 4, end: 8 });
        let m = RawMsg {
            event: 0x77,
            ..Default::default()
        };
        assert_eq!(m.decode(), Msg::Unknown(0x77));
    }
}

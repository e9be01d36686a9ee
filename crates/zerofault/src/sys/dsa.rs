//! The Intel DSA work queues sysfs lists (`/sys/bus/dsa/devices/wqX.Y`, idxd): which of them
//! a process can submit to with ENQCMD. Mapping a queue's portal is [`super::mman::map_portal`].

use super::file::read_to_string;

/// Where idxd lists its devices and work queues.
pub(crate) const DEVICES: &str = "/sys/bus/dsa/devices";

/// An enabled user-type shared work queue, as sysfs describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SharedQueue {
    /// `wqX.Y`: its portal is `/dev/dsa/wqX.Y`.
    pub(crate) name: String,
    /// `max_transfer_size`, bytes (2 MiB when sysfs does not say).
    pub(crate) max_transfer: usize,
}

/// The enabled user-type shared work queues under [`DEVICES`], in directory order. `Err` when
/// the directory cannot be read (no idxd driver); a queue whose attributes cannot be read is
/// left out.
pub(crate) fn shared_queues() -> std::io::Result<Vec<SharedQueue>> {
    let dir = std::fs::read_dir(DEVICES)?;
    let mut queues = Vec::new();
    for e in dir.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with("wq") {
            continue;
        }
        let attr = |a: &str| read_to_string(e.path().join(a)).map(|s| s.trim().to_string());
        let ok = attr("type").is_ok_and(|t| t == "user")
            && attr("mode").is_ok_and(|m| m == "shared")
            && attr("state").is_ok_and(|s| s == "enabled");
        if !ok {
            continue;
        }
        let max_transfer = attr("max_transfer_size")
            .ok()
            .and_then(|s| s.parse::<usize>().ok())
            .unwrap_or(2 << 20);
        queues.push(SharedQueue { name, max_transfer });
    }
    Ok(queues)
}

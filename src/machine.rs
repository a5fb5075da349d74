//! The machine the models run on, as the catalog's tiers need it: where local models run
//! (`Accelerator`: the CPU, or a Metal or CUDA GPU, as MLX says) and how much memory they can
//! have there: MLX's device information for a GPU (unified memory, all of the RAM, on Apple
//! Silicon; the GPU's own on CUDA), else `nvidia-smi` for a CUDA GPU, `/proc/meminfo` for the
//! CPU. [`Machine::budget`] is what the models may have: Metal's recommended working set (or
//! the share of the RAM macOS gives the GPU), 90 % of a CUDA GPU's memory, nothing on the CPU.
//!
//! Every probe fails soft: a number that cannot be read is `None`, and the tiers then fall
//! back to the CPU defaults ([`crate::catalog::plan`]).

use crate::engine::runtime::{gpu_memory, DevicePref, MlxInfo};

/// Where local models run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accelerator {
    Cpu,
    /// Apple Silicon: the GPU shares the RAM (unified memory).
    Metal,
    /// An NVIDIA GPU with its own memory.
    Cuda,
}

impl Accelerator {
    pub fn label(self) -> &'static str {
        match self {
            Accelerator::Cpu => "cpu",
            Accelerator::Metal => "metal",
            Accelerator::Cuda => "cuda",
        }
    }
}

/// The facts the tiers are chosen by.
#[derive(Clone, Debug, PartialEq)]
pub struct Machine {
    pub accelerator: Accelerator,
    /// Bytes of memory on the device the models run on: the RAM on Metal (unified) and on the
    /// CPU, the GPU's memory on CUDA. `None` when it could not be read.
    pub memory: Option<u64>,
    /// The GPU working-set limit where the device states one (Metal's recommended maximum):
    /// the most the models may hold there.
    pub working_set: Option<u64>,
    /// Where the numbers came from, for `laya doctor`.
    pub source: String,
}

const GIB: u64 = 1 << 30;

impl Machine {
    /// A machine of `accelerator` with `gib` GiB of memory and no stated working set (tests
    /// and tables).
    pub fn new(accelerator: Accelerator, gib: u64) -> Machine {
        Machine {
            accelerator,
            memory: Some(gib * GIB),
            working_set: None,
            source: "given".into(),
        }
    }

    /// This machine, for the device `pref` chooses with the linked MLX. Reads no more than
    /// it needs: MLX's device information for a GPU (Metal: the RAM and the recommended
    /// working set; CUDA: the GPU's total memory), else `nvidia-smi` for a CUDA GPU, and
    /// `/proc/meminfo` for the CPU.
    pub fn probe(pref: DevicePref) -> Machine {
        let info = MlxInfo::probe();
        let accelerator = match info.device_for(pref) {
            Ok(desc) if desc.starts_with("gpu") => match info.gpu_kind {
                Some("metal") => Accelerator::Metal,
                _ => Accelerator::Cuda,
            },
            _ => Accelerator::Cpu,
        };
        let mut m = Machine {
            accelerator,
            memory: None,
            working_set: None,
            source: String::new(),
        };
        match accelerator {
            Accelerator::Metal | Accelerator::Cuda => {
                let gpu = gpu_memory();
                m.working_set = gpu.working_set;
                if let Some(bytes) = gpu.total {
                    m.memory = Some(bytes);
                    m.source = "MLX device info".into();
                } else if accelerator == Accelerator::Cuda {
                    m.memory = nvidia_smi_memory();
                    m.source = "nvidia-smi".into();
                }
            }
            Accelerator::Cpu => {
                m.memory = std::fs::read_to_string("/proc/meminfo")
                    .ok()
                    .and_then(|t| parse_meminfo_total(&t));
                m.source = "/proc/meminfo".into();
            }
        }
        if m.memory.is_none() {
            m.source = "unknown".into();
        }
        m
    }

    /// What the memory is called on this machine, for reports.
    pub fn memory_kind(&self) -> &'static str {
        match self.accelerator {
            Accelerator::Metal => "unified memory",
            Accelerator::Cuda => "GPU memory",
            Accelerator::Cpu => "RAM",
        }
    }

    /// The bytes laya plans its models within, `None` where nothing is known or the models run
    /// on the CPU (whose tiers are fixed: the CPU is for correctness, not speed).
    ///
    /// - Metal: the GPU's recommended working set where MLX states it, else the share of the
    ///   RAM macOS gives the GPU by default (two thirds up to 32 GiB, three quarters above): the
    ///   rest stays with macOS, the editor and everything else.
    /// - CUDA: 90 % of the GPU's memory (the CUDA context, cuBLAS's workspace and
    ///   fragmentation take the rest).
    pub fn budget(&self) -> Option<u64> {
        let memory = self.memory?;
        match self.accelerator {
            Accelerator::Cpu => None,
            Accelerator::Metal => Some(self.working_set.unwrap_or(if memory <= 32 * GIB {
                memory / 3 * 2
            } else {
                memory / 4 * 3
            })),
            Accelerator::Cuda => Some(memory / 10 * 9),
        }
    }
}

impl std::fmt::Display for Machine {
    /// `64.0 GiB unified memory (metal; MLX device info)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.memory {
            Some(b) => write!(
                f,
                "{} {} ({}; {})",
                gib(b),
                self.memory_kind(),
                self.accelerator.label(),
                self.source
            ),
            None => write!(f, "unknown {} ({})", self.memory_kind(), self.accelerator.label()),
        }
    }
}

/// `12.3 GiB`.
pub fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / GIB as f64)
}

/// `MemTotal:  16318412 kB` → bytes.
pub fn parse_meminfo_total(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let mut words = line.split_whitespace().skip(1);
    let n: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") | None => n.checked_mul(1024),
        _ => None,
    }
}

/// The first GPU's total memory from `nvidia-smi --query-gpu=memory.total
/// --format=csv,noheader,nounits` (MiB, one line a GPU).
pub fn parse_nvidia_smi_total(text: &str) -> Option<u64> {
    let mib: u64 = text.lines().next()?.trim().parse().ok()?;
    mib.checked_mul(1 << 20)
}

fn nvidia_smi_memory() -> Option<u64> {
    let out = std::process::Command::new("nvidia-smi")
        .args([
            "--query-gpu=memory.total",
            "--format=csv,noheader,nounits",
            "--id=0",
        ])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| parse_nvidia_smi_total(&String::from_utf8_lossy(&out.stdout)))
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_and_nvidia_smi_read_as_bytes() {
        let meminfo = "MemTotal:       16318412 kB\nMemFree:         1000 kB\n";
        assert_eq!(parse_meminfo_total(meminfo), Some(16318412 * 1024));
        assert_eq!(parse_meminfo_total("MemFree: 1 kB\n"), None);
        assert_eq!(parse_meminfo_total("MemTotal: lots kB\n"), None);
        assert_eq!(parse_nvidia_smi_total("143771\n143771\n"), Some(143771 << 20));
        assert_eq!(parse_nvidia_smi_total("[N/A]\n"), None);
        assert_eq!(parse_nvidia_smi_total(""), None);
    }

    #[test]
    fn the_budget_leaves_macos_its_share_and_cuda_its_context() {
        let budget = |m: Machine| m.budget().map(|b| b as f64 / GIB as f64);
        let near = |got: Option<f64>, want: f64| got.is_some_and(|g| (g - want).abs() < 1e-6);
        assert!(near(budget(Machine::new(Accelerator::Metal, 16)), 32.0 / 3.0));
        assert!(near(budget(Machine::new(Accelerator::Metal, 64)), 48.0));
        let stated = Machine {
            working_set: Some(40 * GIB),
            ..Machine::new(Accelerator::Metal, 64)
        };
        assert!(near(budget(stated), 40.0));
        assert!(near(budget(Machine::new(Accelerator::Cuda, 80)), 72.0));
        assert_eq!(budget(Machine::new(Accelerator::Cpu, 64)), None);
        let unknown = Machine {
            memory: None,
            ..Machine::new(Accelerator::Cuda, 80)
        };
        assert_eq!(budget(unknown), None);
    }

    #[test]
    fn this_machine_is_probed_without_failing() {
        // This build runs on the CPU here: the RAM from /proc/meminfo.
        let m = Machine::probe(DevicePref::Cpu);
        assert_eq!(m.accelerator, Accelerator::Cpu);
        if std::path::Path::new("/proc/meminfo").exists() {
            assert!(m.memory.is_some_and(|b| b > GIB), "{m}");
        }
        assert!(m.to_string().contains("RAM (cpu"), "{m}");
    }
}

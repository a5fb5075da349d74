//! GGUF v2/v3 reader.
//!
//! [`GgufFile::open`] memory-maps a file, parses the header, the metadata key/value pairs and the
//! tensor infos, and validates every tensor's type, shape and byte range up front; afterwards
//! [`GgufFile::tensor_bytes`] hands out slices of the map and [`GgufFile::dequantize`] decodes a
//! tensor to `f32`. Files are untrusted input: every read is bounds-checked, counts and lengths
//! are checked against the bytes left before anything is allocated, array nesting is limited,
//! and all failures are [`LoadError`]s naming the file (and the tensor or key) — never panics.
//!
//! Layout (little-endian): magic `GGUF`, u32 version, u64 tensor count, u64 KV count, the KV
//! pairs (string key, u32 value type, value), the tensor infos (string name, u32 n_dims, u64
//! dims with `ne0` first, u32 ggml type, u64 offset relative to the data section), padding to
//! `general.alignment` (default 32), then the tensor data.

use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use super::dequant::{self, DequantError};
pub(crate) use super::ggml_type::GgmlType;

const MAGIC: [u8; 4] = *b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's GGML_MAX_DIMS.
const MAX_DIMS: u32 = 4;
/// Arrays of arrays are legal GGUF; deeper nesting than this is treated as hostile
/// (each level recurses once in the parser).
const MAX_ARRAY_NESTING: usize = 8;
/// Collections of parsed items (KV pairs, tensor infos, strings, arrays) start with at most
/// this capacity and grow as items actually parse, so a lying count cannot make us reserve
/// memory several times the file size up front.
const MAX_PREALLOC: usize = 1 << 16;

/// Everything that can go wrong reading a GGUF file. Every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{}: {source}", file.display())]
    Io {
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: not a GGUF file (magic {found:02x?}, expected \"GGUF\")", file.display())]
    BadMagic { file: PathBuf, found: Vec<u8> },
    #[error("{}: unsupported GGUF version {version} (laya reads versions 2 and 3)", file.display())]
    UnsupportedVersion { file: PathBuf, version: u32 },
    #[error(
        "{}: file truncated: {what} needs {needed} bytes at offset {offset}, but the file has {file_len} bytes",
        file.display()
    )]
    Truncated {
        file: PathBuf,
        what: String,
        offset: u64,
        needed: u64,
        file_len: u64,
    },
    #[error("{}: malformed GGUF: {reason}", file.display())]
    Malformed { file: PathBuf, reason: String },
    #[error("{}: tensor {tensor:?} has unknown ggml type id {type_id}", file.display())]
    UnknownType {
        file: PathBuf,
        tensor: String,
        type_id: u32,
    },
    #[error(
        "{}: tensor {tensor:?} data (bytes {start}..{end}) lies outside the file ({file_len} bytes)",
        file.display()
    )]
    TensorOutOfBounds {
        file: PathBuf,
        tensor: String,
        start: u64,
        end: u64,
        file_len: u64,
    },
    #[error("{}: no tensor named {tensor:?}", file.display())]
    MissingTensor { file: PathBuf, tensor: String },
    #[error("{}: metadata key {key:?} is missing", file.display())]
    MissingMetadata { file: PathBuf, key: String },
    #[error("{}: metadata key {key:?} should be {expected}, found {found}", file.display())]
    WrongMetadataType {
        file: PathBuf,
        key: String,
        expected: &'static str,
        found: String,
    },
    #[error(
        "{}: tensor {tensor:?} has shape {found:?} (ne0 first), expected {expected:?}",
        file.display()
    )]
    #[cfg(test)]
    ShapeMismatch {
        file: PathBuf,
        tensor: String,
        expected: Vec<u64>,
        found: Vec<u64>,
    },
    #[error("{}: tensor {tensor:?}: {source}", file.display())]
    Dequant {
        file: PathBuf,
        tensor: String,
        #[source]
        source: DequantError,
    },
}

/// A metadata value. Arrays keep their element type (see [`MetaArray`]).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(MetaArray),
}

/// A homogeneous metadata array; arrays of arrays hold one [`MetaArray`] per element.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum MetaArray {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F32(Vec<f32>),
    F64(Vec<f64>),
    Bool(Vec<bool>),
    String(Vec<String>),
    Array(Vec<MetaArray>),
}

impl MetaValue {
    /// The value of any integer type, if it is one.
    pub(crate) fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            MetaValue::U8(v) => v.into(),
            MetaValue::I8(v) => v.into(),
            MetaValue::U16(v) => v.into(),
            MetaValue::I16(v) => v.into(),
            MetaValue::U32(v) => v.into(),
            MetaValue::I32(v) => v.into(),
            MetaValue::U64(v) => v.into(),
            MetaValue::I64(v) => v.into(),
            _ => return None,
        })
    }

    fn describe(&self) -> String {
        match self {
            MetaValue::Array(a) => a.type_name(),
            MetaValue::String(s) if s.len() > 40 => format!("string ({} bytes)", s.len()),
            MetaValue::String(s) => format!("string {s:?}"),
            MetaValue::F32(v) => format!("f32 {v}"),
            MetaValue::F64(v) => format!("f64 {v}"),
            MetaValue::Bool(v) => format!("bool {v}"),
            other => format!(
                "{} {}",
                scalar_type_name(other),
                other.as_i128().unwrap_or_default()
            ),
        }
    }
}

fn scalar_type_name(v: &MetaValue) -> &'static str {
    match v {
        MetaValue::U8(_) => "u8",
        MetaValue::I8(_) => "i8",
        MetaValue::U16(_) => "u16",
        MetaValue::I16(_) => "i16",
        MetaValue::U32(_) => "u32",
        MetaValue::I32(_) => "i32",
        MetaValue::U64(_) => "u64",
        MetaValue::I64(_) => "i64",
        MetaValue::F32(_) => "f32",
        MetaValue::F64(_) => "f64",
        MetaValue::Bool(_) => "bool",
        MetaValue::String(_) => "string",
        MetaValue::Array(_) => "array",
    }
}

impl MetaArray {
    pub(crate) fn len(&self) -> usize {
        match self {
            MetaArray::U8(v) => v.len(),
            MetaArray::I8(v) => v.len(),
            MetaArray::U16(v) => v.len(),
            MetaArray::I16(v) => v.len(),
            MetaArray::U32(v) => v.len(),
            MetaArray::I32(v) => v.len(),
            MetaArray::U64(v) => v.len(),
            MetaArray::I64(v) => v.len(),
            MetaArray::F32(v) => v.len(),
            MetaArray::F64(v) => v.len(),
            MetaArray::Bool(v) => v.len(),
            MetaArray::String(v) => v.len(),
            MetaArray::Array(v) => v.len(),
        }
    }

    fn elem_type_name(&self) -> &'static str {
        match self {
            MetaArray::U8(_) => "u8",
            MetaArray::I8(_) => "i8",
            MetaArray::U16(_) => "u16",
            MetaArray::I16(_) => "i16",
            MetaArray::U32(_) => "u32",
            MetaArray::I32(_) => "i32",
            MetaArray::U64(_) => "u64",
            MetaArray::I64(_) => "i64",
            MetaArray::F32(_) => "f32",
            MetaArray::F64(_) => "f64",
            MetaArray::Bool(_) => "bool",
            MetaArray::String(_) => "string",
            MetaArray::Array(_) => "array",
        }
    }

    pub(crate) fn type_name(&self) -> String {
        format!("array[{}; {}]", self.elem_type_name(), self.len())
    }

    /// The elements as i32 if the array has an integer type and every element fits.
    fn to_i32(&self) -> Option<Vec<i32>> {
        fn conv<T: Copy>(v: &[T]) -> Option<Vec<i32>>
        where
            i32: TryFrom<T>,
        {
            v.iter().map(|&x| i32::try_from(x).ok()).collect()
        }
        match self {
            MetaArray::U8(v) => conv(v),
            MetaArray::I8(v) => conv(v),
            MetaArray::U16(v) => conv(v),
            MetaArray::I16(v) => conv(v),
            MetaArray::U32(v) => conv(v),
            MetaArray::I32(v) => Some(v.clone()),
            MetaArray::U64(v) => conv(v),
            MetaArray::I64(v) => conv(v),
            _ => None,
        }
    }
}

/// One tensor's header entry, validated against the file it came from.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TensorInfo {
    name: String,
    dims: Vec<u64>,
    ty: GgmlType,
    offset: u64,
    n_elements: u64,
    n_bytes: u64,
}

impl TensorInfo {
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Dimensions in ggml order: `ne0` (contiguous, fastest) first.
    pub(crate) fn dims(&self) -> &[u64] {
        &self.dims
    }

    #[cfg(test)]
    pub(crate) fn ty(&self) -> GgmlType {
        self.ty
    }

    #[cfg(test)]
    pub(crate) fn n_elements(&self) -> u64 {
        self.n_elements
    }

    #[cfg(test)]
    pub(crate) fn n_bytes(&self) -> u64 {
        self.n_bytes
    }
}

enum Bytes {
    Mapped(Mmap),
    Owned(Vec<u8>),
}

impl Bytes {
    fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

/// An open GGUF file: parsed header plus the mapped bytes.
pub(crate) struct GgufFile {
    path: PathBuf,
    bytes: Bytes,
    version: u32,
    metadata: Vec<(String, MetaValue)>,
    metadata_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    alignment: u64,
    data_offset: u64,
}

impl fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .field("data_offset", &self.data_offset)
            .finish()
    }
}

impl GgufFile {
    /// Memory-map and parse the GGUF file at `path`.
    pub(crate) fn open(path: impl AsRef<Path>) -> Result<GgufFile, LoadError> {
        let path = path.as_ref().to_path_buf();
        let io = |source| LoadError::Io {
            file: path.clone(),
            source,
        };
        let file = File::open(&path).map_err(io)?;
        // SAFETY: the map is read-only and private to this process. Like llama.cpp we accept that
        // another process truncating or rewriting the model file while it is open is undefined
        // behaviour; laya never writes model files in place (fetches go to a temp file + rename).
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        Self::parse(path, Bytes::Mapped(map))
    }

    /// Parse a GGUF image held in memory; `path` only labels errors.
    #[cfg(test)]
    pub(crate) fn from_bytes(path: impl Into<PathBuf>, bytes: Vec<u8>) -> Result<GgufFile, LoadError> {
        Self::parse(path.into(), Bytes::Owned(bytes))
    }

    fn parse(path: PathBuf, bytes: Bytes) -> Result<GgufFile, LoadError> {
        let buf = bytes.as_slice();
        let mut r = Reader {
            buf,
            pos: 0,
            file: &path,
        };
        let magic = r.take(4, "magic")?;
        if magic != MAGIC {
            return Err(LoadError::BadMagic {
                file: path.clone(),
                found: magic.to_vec(),
            });
        }
        let version = r.u32("version")?;
        if version != 2 && version != 3 {
            return Err(LoadError::UnsupportedVersion {
                file: path.clone(),
                version,
            });
        }
        // Each tensor info takes at least 8 (name length) + 4 (n_dims) + 4 (type) + 8 (offset)
        // bytes; each KV pair at least 8 (key length) + 4 (type) + 1 (u8 value).
        let n_tensors = r.u64("tensor count")?;
        let n_kv = r.u64("metadata count")?;
        r.check_count(n_kv, 13, "metadata key/value pairs")?;

        let cap = (n_kv as usize).min(MAX_PREALLOC);
        let mut metadata = Vec::with_capacity(cap);
        let mut metadata_index = HashMap::with_capacity(cap);
        for _ in 0..n_kv {
            let key = r.string("metadata key")?;
            let ty = r.u32(&key)?;
            let value = r.value(ty, &key, 0)?;
            if metadata_index.insert(key.clone(), metadata.len()).is_some() {
                return Err(r.malformed(format!("duplicate metadata key {key:?}")));
            }
            metadata.push((key, value));
        }

        r.check_count(n_tensors, 24, "tensor infos")?;
        let cap = (n_tensors as usize).min(MAX_PREALLOC);
        let mut tensors = Vec::with_capacity(cap);
        let mut tensor_index = HashMap::with_capacity(cap);
        for _ in 0..n_tensors {
            let info = r.tensor_info()?;
            if tensor_index.insert(info.name.clone(), tensors.len()).is_some() {
                return Err(r.malformed(format!("duplicate tensor name {:?}", info.name)));
            }
            tensors.push(info);
        }

        let mut file = GgufFile {
            path: path.clone(),
            bytes: Bytes::Owned(Vec::new()),
            version,
            metadata,
            metadata_index,
            tensors,
            tensor_index,
            alignment: DEFAULT_ALIGNMENT,
            data_offset: 0,
        };
        if file.get("general.alignment").is_some() {
            let a = u64::from(file.get_u32("general.alignment")?);
            if !a.is_power_of_two() {
                return Err(file.malformed(format!("general.alignment {a} is not a power of two")));
            }
            file.alignment = a;
        }
        let header_end = r.pos as u64;
        let file_len = buf.len() as u64;
        file.data_offset = header_end
            .checked_next_multiple_of(file.alignment)
            .ok_or_else(|| file.malformed("data offset overflows".into()))?;

        for t in &file.tensors {
            if t.offset % file.alignment != 0 {
                return Err(file.malformed(format!(
                    "tensor {:?} offset {} is not a multiple of the alignment {}",
                    t.name, t.offset, file.alignment
                )));
            }
            let start = file.data_offset.checked_add(t.offset);
            let end = start.and_then(|s| s.checked_add(t.n_bytes));
            match (start, end) {
                (Some(_), Some(end)) if end <= file_len => {}
                _ => {
                    return Err(LoadError::TensorOutOfBounds {
                        file: path.clone(),
                        tensor: t.name.clone(),
                        start: start.unwrap_or(u64::MAX),
                        end: end.unwrap_or(u64::MAX),
                        file_len,
                    })
                }
            }
        }
        file.bytes = bytes;
        Ok(file)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    #[cfg(test)]
    pub(crate) fn version(&self) -> u32 {
        self.version
    }

    /// Alignment of the data section and of every tensor offset.
    #[cfg(test)]
    pub(crate) fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute file offset where tensor data starts.
    #[cfg(test)]
    pub(crate) fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// All metadata pairs in file order.
    #[cfg(test)]
    pub(crate) fn metadata(&self) -> &[(String, MetaValue)] {
        &self.metadata
    }

    pub(crate) fn get(&self, key: &str) -> Option<&MetaValue> {
        self.metadata_index.get(key).map(|&i| &self.metadata[i].1)
    }

    fn require(&self, key: &str) -> Result<&MetaValue, LoadError> {
        self.get(key).ok_or_else(|| LoadError::MissingMetadata {
            file: self.path.clone(),
            key: key.to_owned(),
        })
    }

    fn wrong_type(&self, key: &str, expected: &'static str, found: &MetaValue) -> LoadError {
        LoadError::WrongMetadataType {
            file: self.path.clone(),
            key: key.to_owned(),
            expected,
            found: found.describe(),
        }
    }

    /// Any integer type whose value fits in u32 (GGUF writers differ on widths).
    pub(crate) fn get_u32(&self, key: &str) -> Result<u32, LoadError> {
        let v = self.require(key)?;
        v.as_i128()
            .and_then(|x| u32::try_from(x).ok())
            .ok_or_else(|| self.wrong_type(key, "an integer in u32 range", v))
    }

    /// Any integer type whose value fits in u64.
    #[cfg(test)]
    pub(crate) fn get_u64(&self, key: &str) -> Result<u64, LoadError> {
        let v = self.require(key)?;
        v.as_i128()
            .and_then(|x| u64::try_from(x).ok())
            .ok_or_else(|| self.wrong_type(key, "an integer in u64 range", v))
    }

    /// An f32, or an f64 rounded to f32.
    pub(crate) fn get_f32(&self, key: &str) -> Result<f32, LoadError> {
        match self.require(key)? {
            MetaValue::F32(x) => Ok(*x),
            MetaValue::F64(x) => Ok(*x as f32),
            v => Err(self.wrong_type(key, "f32", v)),
        }
    }

    pub(crate) fn get_str(&self, key: &str) -> Result<&str, LoadError> {
        match self.require(key)? {
            MetaValue::String(s) => Ok(s),
            v => Err(self.wrong_type(key, "string", v)),
        }
    }

    #[cfg(test)]
    pub(crate) fn get_bool(&self, key: &str) -> Result<bool, LoadError> {
        match self.require(key)? {
            MetaValue::Bool(b) => Ok(*b),
            v => Err(self.wrong_type(key, "bool", v)),
        }
    }

    pub(crate) fn get_bool_array(&self, key: &str) -> Result<&[bool], LoadError> {
        match self.require(key)? {
            MetaValue::Array(MetaArray::Bool(v)) => Ok(v),
            v => Err(self.wrong_type(key, "array of bools", v)),
        }
    }

    pub(crate) fn get_str_array(&self, key: &str) -> Result<&[String], LoadError> {
        match self.require(key)? {
            MetaValue::Array(MetaArray::String(v)) => Ok(v),
            v => Err(self.wrong_type(key, "array of strings", v)),
        }
    }

    /// An array of any integer type whose elements all fit in i32.
    pub(crate) fn get_i32_array(&self, key: &str) -> Result<Vec<i32>, LoadError> {
        let v = self.require(key)?;
        match v {
            MetaValue::Array(a) => a.to_i32(),
            _ => None,
        }
        .ok_or_else(|| self.wrong_type(key, "an array of integers in i32 range", v))
    }

    /// Tensor infos in file order.
    pub(crate) fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub(crate) fn tensor(&self, name: &str) -> Result<&TensorInfo, LoadError> {
        self.tensor_index
            .get(name)
            .map(|&i| &self.tensors[i])
            .ok_or_else(|| LoadError::MissingTensor {
                file: self.path.clone(),
                tensor: name.to_owned(),
            })
    }

    /// The tensor `name`, checked to have dimensions `expected` (ne0 first).
    #[cfg(test)]
    pub(crate) fn expect_shape(&self, name: &str, expected: &[u64]) -> Result<&TensorInfo, LoadError> {
        let info = self.tensor(name)?;
        if info.dims != expected {
            return Err(LoadError::ShapeMismatch {
                file: self.path.clone(),
                tensor: name.to_owned(),
                expected: expected.to_vec(),
                found: info.dims.clone(),
            });
        }
        Ok(info)
    }

    /// The raw bytes of a tensor's data.
    pub(crate) fn tensor_bytes(&self, info: &TensorInfo) -> Result<&[u8], LoadError> {
        let buf = self.bytes.as_slice();
        let start = self.data_offset.checked_add(info.offset);
        let end = start.and_then(|s| s.checked_add(info.n_bytes));
        match (start, end) {
            (Some(s), Some(e)) if e <= buf.len() as u64 => Ok(&buf[s as usize..e as usize]),
            _ => Err(LoadError::TensorOutOfBounds {
                file: self.path.clone(),
                tensor: info.name.clone(),
                start: start.unwrap_or(u64::MAX),
                end: end.unwrap_or(u64::MAX),
                file_len: buf.len() as u64,
            }),
        }
    }

    /// The whole tensor `name` as f32, in storage order (row-major, ne0 fastest).
    pub(crate) fn dequantize(&self, name: &str) -> Result<Vec<f32>, LoadError> {
        let info = self.tensor(name)?;
        let dequant_err = |source| LoadError::Dequant {
            file: self.path.clone(),
            tensor: name.to_owned(),
            source,
        };
        if !dequant::supports(info.ty) {
            return Err(dequant_err(DequantError::Unsupported(info.ty)));
        }
        let bytes = self.tensor_bytes(info)?;
        // n_elements is bounded by the tensor's bytes, which lie inside the file.
        let n = info.n_elements as usize;
        let mut out = vec![0.0f32; n];
        dequant::dequantize(info.ty, bytes, n, &mut out).map_err(dequant_err)?;
        Ok(out)
    }

    fn malformed(&self, reason: String) -> LoadError {
        LoadError::Malformed {
            file: self.path.clone(),
            reason,
        }
    }
}

/// Bounds-checked little-endian cursor over the file image.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    file: &'a Path,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn truncated(&self, what: &str, needed: u64) -> LoadError {
        LoadError::Truncated {
            file: self.file.to_path_buf(),
            what: what.to_owned(),
            offset: self.pos as u64,
            needed,
            file_len: self.buf.len() as u64,
        }
    }

    fn malformed(&self, reason: String) -> LoadError {
        LoadError::Malformed {
            file: self.file.to_path_buf(),
            reason: format!("{reason} (at byte {})", self.pos),
        }
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], LoadError> {
        if n > self.remaining() {
            return Err(self.truncated(what, n as u64));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], LoadError> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &str) -> Result<u32, LoadError> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &str) -> Result<u64, LoadError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// Fails unless `count` items of at least `min_size` bytes each can fit in the bytes left,
    /// so hostile counts are rejected before anything is allocated for them.
    fn check_count(&self, count: u64, min_size: u64, what: &str) -> Result<(), LoadError> {
        match count.checked_mul(min_size) {
            Some(n) if n <= self.remaining() as u64 => Ok(()),
            _ => Err(self.truncated(&format!("{count} {what}"), count.saturating_mul(min_size))),
        }
    }

    fn string(&mut self, what: &str) -> Result<String, LoadError> {
        let len = self.u64(what)?;
        if len > self.remaining() as u64 {
            return Err(self.truncated(&format!("{what} (string of {len} bytes)"), len));
        }
        let bytes = self.take(len as usize, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(e) => Err(self.malformed(format!("{what} is not valid UTF-8: {e}"))),
        }
    }

    fn value(&mut self, ty: u32, key: &str, depth: usize) -> Result<MetaValue, LoadError> {
        Ok(match ty {
            0 => MetaValue::U8(u8::from_le_bytes(self.array(key)?)),
            1 => MetaValue::I8(i8::from_le_bytes(self.array(key)?)),
            2 => MetaValue::U16(u16::from_le_bytes(self.array(key)?)),
            3 => MetaValue::I16(i16::from_le_bytes(self.array(key)?)),
            4 => MetaValue::U32(u32::from_le_bytes(self.array(key)?)),
            5 => MetaValue::I32(i32::from_le_bytes(self.array(key)?)),
            6 => MetaValue::F32(f32::from_le_bytes(self.array(key)?)),
            7 => MetaValue::Bool(self.bool(key)?),
            8 => MetaValue::String(self.string(key)?),
            9 => MetaValue::Array(self.meta_array(key, depth)?),
            10 => MetaValue::U64(u64::from_le_bytes(self.array(key)?)),
            11 => MetaValue::I64(i64::from_le_bytes(self.array(key)?)),
            12 => MetaValue::F64(f64::from_le_bytes(self.array(key)?)),
            other => return Err(self.malformed(format!("metadata {key:?} has unknown value type {other}"))),
        })
    }

    fn bool(&mut self, key: &str) -> Result<bool, LoadError> {
        match self.array::<1>(key)?[0] {
            0 => Ok(false),
            1 => Ok(true),
            b => Err(self.malformed(format!("metadata {key:?} has bool byte {b}"))),
        }
    }

    /// `n` fixed-size little-endian numbers, read from one bounds-checked slice.
    fn numbers<T, const N: usize>(
        &mut self,
        n: usize,
        key: &str,
        conv: fn([u8; N]) -> T,
    ) -> Result<Vec<T>, LoadError> {
        let bytes = self.take(n * N, key)?; // n * N <= remaining: checked by the caller
        Ok(bytes
            .chunks_exact(N)
            .map(|c| {
                let mut a = [0u8; N];
                a.copy_from_slice(c);
                conv(a)
            })
            .collect())
    }

    fn meta_array(&mut self, key: &str, depth: usize) -> Result<MetaArray, LoadError> {
        if depth >= MAX_ARRAY_NESTING {
            return Err(self.malformed(format!(
                "metadata {key:?} nests arrays deeper than {MAX_ARRAY_NESTING}"
            )));
        }
        let elem = self.u32(key)?;
        let count = self.u64(key)?;
        // Smallest encoding of one element: strings need their u64 length, arrays their
        // u32 type + u64 count.
        let min_size = match elem {
            0 | 1 | 7 => 1,
            2 | 3 => 2,
            4..=6 => 4,
            8 | 10..=12 => 8,
            9 => 12,
            other => {
                return Err(self.malformed(format!(
                    "metadata {key:?} is an array of unknown value type {other}"
                )))
            }
        };
        self.check_count(count, min_size, &format!("elements of metadata array {key:?}"))?;
        let n = count as usize;
        // Element-wise collects grow as elements parse (`Result`'s collect reports no lower
        // size bound), so a lying count costs nothing before it fails.
        Ok(match elem {
            0 => MetaArray::U8(self.numbers(n, key, u8::from_le_bytes)?),
            1 => MetaArray::I8(self.numbers(n, key, i8::from_le_bytes)?),
            2 => MetaArray::U16(self.numbers(n, key, u16::from_le_bytes)?),
            3 => MetaArray::I16(self.numbers(n, key, i16::from_le_bytes)?),
            4 => MetaArray::U32(self.numbers(n, key, u32::from_le_bytes)?),
            5 => MetaArray::I32(self.numbers(n, key, i32::from_le_bytes)?),
            6 => MetaArray::F32(self.numbers(n, key, f32::from_le_bytes)?),
            7 => MetaArray::Bool((0..n).map(|_| self.bool(key)).collect::<Result<_, _>>()?),
            8 => MetaArray::String((0..n).map(|_| self.string(key)).collect::<Result<_, _>>()?),
            9 => MetaArray::Array(
                (0..n)
                    .map(|_| self.meta_array(key, depth + 1))
                    .collect::<Result<_, _>>()?,
            ),
            10 => MetaArray::U64(self.numbers(n, key, u64::from_le_bytes)?),
            11 => MetaArray::I64(self.numbers(n, key, i64::from_le_bytes)?),
            _ => MetaArray::F64(self.numbers(n, key, f64::from_le_bytes)?),
        })
    }

    fn tensor_info(&mut self) -> Result<TensorInfo, LoadError> {
        let name = self.string("tensor name")?;
        let n_dims = self.u32(&name)?;
        if n_dims > MAX_DIMS {
            return Err(self.malformed(format!(
                "tensor {name:?} has {n_dims} dimensions (at most {MAX_DIMS})"
            )));
        }
        let dims = (0..n_dims)
            .map(|_| self.u64(&name))
            .collect::<Result<Vec<_>, _>>()?;
        let type_id = self.u32(&name)?;
        let offset = self.u64(&name)?;
        let ty = GgmlType::from_id(type_id).ok_or_else(|| LoadError::UnknownType {
            file: self.file.to_path_buf(),
            tensor: name.clone(),
            type_id,
        })?;
        // Element and byte counts must fit in i64 (ggml's int64_t ne / size_t nbytes).
        let n_elements = dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .filter(|&n| n <= i64::MAX as u64)
            .ok_or_else(|| {
                self.malformed(format!(
                    "tensor {name:?} dims {dims:?} overflow the element count"
                ))
            })?;
        let block = ty.block_size() as u64;
        let ne0 = dims.first().copied().unwrap_or(1);
        if ne0 % block != 0 {
            return Err(self.malformed(format!(
                "tensor {name:?} ne0 {ne0} is not a multiple of the {ty} block size {block}"
            )));
        }
        let n_bytes = (n_elements / block)
            .checked_mul(ty.type_size() as u64)
            .ok_or_else(|| self.malformed(format!("tensor {name:?} byte size overflows")))?;
        Ok(TensorInfo {
            name,
            dims,
            ty,
            offset,
            n_elements,
            n_bytes,
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A real model file of the model directory, for a test of that file: `None` (the test
    /// is skipped) unless `LAYA_TEST_REAL_MODELS=1`; with it, a missing file fails the test
    /// with the fix ([`crate::testing::real_model`]). The one file used is the 0.5B's,
    /// [`MODEL_05B`].
    #[track_caller]
    pub(crate) fn real_model_path(file_name: &str) -> Option<PathBuf> {
        let fix = match file_name {
            MODEL_05B => "laya models fetch qwen2.5-coder-0.5b",
            _ => "laya models fetch",
        };
        crate::testing::real_model(file_name, fix)
    }

    pub(crate) const MODEL_05B: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";

    /// Minimal GGUF writer for tests (also usable by other modules' tests).
    pub(crate) struct GgufWriter {
        pub(crate) version: u32,
        kv: Vec<u8>,
        n_kv: u64,
        /// (name, dims ne0 first, raw ggml type id, data)
        pub(crate) tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)>,
        pub(crate) alignment: u64,
        /// Added to every recorded tensor offset (not to where the data is written).
        pub(crate) offset_shift: u64,
    }

    impl GgufWriter {
        pub(crate) fn new() -> Self {
            GgufWriter {
                version: 3,
                kv: Vec::new(),
                n_kv: 0,
                tensors: Vec::new(),
                alignment: DEFAULT_ALIGNMENT,
                offset_shift: 0,
            }
        }

        fn key(&mut self, key: &str, ty: u32) -> &mut Vec<u8> {
            self.n_kv += 1;
            put_str(&mut self.kv, key);
            self.kv.extend(ty.to_le_bytes());
            &mut self.kv
        }

        pub(crate) fn u32(&mut self, key: &str, v: u32) -> &mut Self {
            self.key(key, 4).extend(v.to_le_bytes());
            self
        }

        /// A KV pair with value type `ty` whose encoded value is `bytes`.
        pub(crate) fn raw(&mut self, key: &str, ty: u32, bytes: &[u8]) -> &mut Self {
            self.key(key, ty).extend(bytes);
            self
        }

        pub(crate) fn str(&mut self, key: &str, v: &str) -> &mut Self {
            put_str(self.key(key, 8), v);
            self
        }

        pub(crate) fn str_array(&mut self, key: &str, items: &[&str]) -> &mut Self {
            let mut a = 8u32.to_le_bytes().to_vec();
            a.extend((items.len() as u64).to_le_bytes());
            for s in items {
                put_str(&mut a, s);
            }
            self.raw(key, 9, &a)
        }

        pub(crate) fn i32_array(&mut self, key: &str, items: &[i32]) -> &mut Self {
            let mut a = 5u32.to_le_bytes().to_vec();
            a.extend((items.len() as u64).to_le_bytes());
            for v in items {
                a.extend(v.to_le_bytes());
            }
            self.raw(key, 9, &a)
        }

        pub(crate) fn tensor(&mut self, name: &str, dims: &[u64], ty: GgmlType, data: Vec<u8>) -> &mut Self {
            self.tensors.push((name.into(), dims.to_vec(), ty.id(), data));
            self
        }

        pub(crate) fn bytes(&self) -> Vec<u8> {
            let mut out = b"GGUF".to_vec();
            out.extend(self.version.to_le_bytes());
            out.extend((self.tensors.len() as u64).to_le_bytes());
            out.extend(self.n_kv.to_le_bytes());
            out.extend(&self.kv);
            let mut offset = 0u64;
            let mut offsets = Vec::new();
            for (name, dims, ty, data) in &self.tensors {
                put_str(&mut out, name);
                out.extend((dims.len() as u32).to_le_bytes());
                for d in dims {
                    out.extend(d.to_le_bytes());
                }
                out.extend(ty.to_le_bytes());
                out.extend((offset + self.offset_shift).to_le_bytes());
                offsets.push(offset);
                offset = (offset + data.len() as u64).next_multiple_of(self.alignment);
            }
            // Data section: each tensor at its aligned offset, no padding after the last one.
            let data_start = (out.len() as u64).next_multiple_of(self.alignment);
            for ((_, _, _, data), off) in self.tensors.iter().zip(offsets) {
                out.resize((data_start + off) as usize, 0);
                out.extend(data);
            }
            out
        }
    }

    fn put_str(out: &mut Vec<u8>, s: &str) {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    }

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    /// A small but complete file: scalars of several types, a string array, a nested array, an
    /// F32 tensor, a Q8_0 tensor and an F16 tensor.
    fn sample() -> GgufWriter {
        let mut w = GgufWriter::new();
        w.str("general.architecture", "qwen2")
            .u32("qwen2.block_count", 24)
            .raw("qwen2.rope.freq_base", 6, &1.0e6f32.to_le_bytes())
            .raw("tokenizer.ggml.add_bos_token", 7, &[0])
            .raw("big", 10, &(1u64 << 40).to_le_bytes())
            .raw("neg", 5, &(-7i32).to_le_bytes());
        w.str_array("tokenizer.ggml.tokens", &["a", "Ġb", "<|im_end|>"])
            .i32_array("tokenizer.ggml.token_type", &[1, 1, 3]);
        // array[array[u8; 2]; 2]
        let mut a = 9u32.to_le_bytes().to_vec();
        a.extend(2u64.to_le_bytes());
        for v in [[1u8, 2], [3, 4]] {
            a.extend(0u32.to_le_bytes());
            a.extend(2u64.to_le_bytes());
            a.extend(v);
        }
        w.raw("nested", 9, &a);
        w.tensor("norm", &[4], GgmlType::F32, f32_bytes(&[1.0, -2.0, 0.5, 3.25]));
        let mut q8 = half::f16::from_f32(0.5).to_bits().to_le_bytes().to_vec();
        q8.extend((0..32).map(|i| (i as i8 - 16) as u8));
        w.tensor("w", &[32, 1], GgmlType::Q8_0, q8);
        let h: Vec<u8> = [1.0f32, -0.5]
            .iter()
            .flat_map(|x| half::f16::from_f32(*x).to_bits().to_le_bytes())
            .collect();
        w.tensor("h", &[2], GgmlType::F16, h);
        w
    }

    #[test]
    fn gguf_file_can_be_shared_across_threads() {
        fn shareable<T: Send + Sync>() {}
        shareable::<GgufFile>();
        shareable::<LoadError>();
    }

    #[test]
    fn small_file_round_trips() {
        let bytes = sample().bytes();
        let f = GgufFile::from_bytes("sample.gguf", bytes).unwrap();
        assert_eq!(f.version(), 3);
        assert_eq!(f.metadata().len(), 9);
        assert_eq!(f.get_str("general.architecture").unwrap(), "qwen2");
        assert_eq!(f.get_u32("qwen2.block_count").unwrap(), 24);
        assert_eq!(f.get_u64("qwen2.block_count").unwrap(), 24);
        assert_eq!(f.get_u64("big").unwrap(), 1 << 40);
        assert_eq!(f.get_f32("qwen2.rope.freq_base").unwrap(), 1.0e6);
        assert!(!f.get_bool("tokenizer.ggml.add_bos_token").unwrap());
        assert_eq!(
            f.get_str_array("tokenizer.ggml.tokens").unwrap(),
            ["a", "Ġb", "<|im_end|>"]
        );
        assert_eq!(f.get_i32_array("tokenizer.ggml.token_type").unwrap(), [1, 1, 3]);
        assert_eq!(
            f.get("nested"),
            Some(&MetaValue::Array(MetaArray::Array(vec![
                MetaArray::U8(vec![1, 2]),
                MetaArray::U8(vec![3, 4])
            ])))
        );
        assert_eq!(f.tensors().len(), 3);
        let w = f.tensor("w").unwrap();
        assert_eq!(
            (w.dims(), w.ty(), w.n_elements(), w.n_bytes()),
            (&[32u64, 1][..], GgmlType::Q8_0, 32, 34)
        );
        assert_eq!(f.data_offset() % 32, 0);
        assert_eq!(f.tensor_bytes(w).unwrap().len(), 34);
        assert_eq!(f.dequantize("norm").unwrap(), [1.0, -2.0, 0.5, 3.25]);
        let q: Vec<f32> = (0..32).map(|i| (i - 16) as f32 * 0.5).collect();
        assert_eq!(f.dequantize("w").unwrap(), q);
        assert_eq!(f.dequantize("h").unwrap(), [1.0, -0.5]);
        assert!(f.expect_shape("w", &[32, 1]).is_ok());
    }

    #[test]
    fn version_2_and_custom_alignment_are_read() {
        let mut w = sample();
        w.version = 2;
        w.alignment = 64;
        w.u32("general.alignment", 64);
        let f = GgufFile::from_bytes("v2.gguf", w.bytes()).unwrap();
        assert_eq!((f.version(), f.alignment()), (2, 64));
        assert_eq!(f.data_offset() % 64, 0);
        assert_eq!(f.dequantize("norm").unwrap(), [1.0, -2.0, 0.5, 3.25]);
    }

    #[test]
    fn metadata_getters_report_missing_and_mistyped_keys() {
        let f = GgufFile::from_bytes("sample.gguf", sample().bytes()).unwrap();
        let e = f.get_u32("nope").unwrap_err();
        assert!(matches!(&e, LoadError::MissingMetadata { key, .. } if key == "nope"));
        assert!(e.to_string().contains("sample.gguf"), "{e}");
        let e = f.get_str("qwen2.block_count").unwrap_err();
        assert!(
            matches!(
                e,
                LoadError::WrongMetadataType {
                    expected: "string",
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("u32 24"), "{e}");
        assert!(matches!(
            f.get_u32("neg"),
            Err(LoadError::WrongMetadataType { .. })
        ));
        assert!(matches!(
            f.get_u32("big"),
            Err(LoadError::WrongMetadataType { .. })
        ));
        assert!(matches!(
            f.get_i32_array("tokenizer.ggml.tokens"),
            Err(LoadError::WrongMetadataType { .. })
        ));
        assert!(matches!(
            f.get_str_array("tokenizer.ggml.token_type"),
            Err(LoadError::WrongMetadataType { .. })
        ));
        assert!(matches!(
            f.tensor("missing"),
            Err(LoadError::MissingTensor { .. })
        ));
        let e = f.expect_shape("w", &[32, 2]).unwrap_err();
        assert!(
            matches!(&e, LoadError::ShapeMismatch { tensor, expected, found, .. }
                if tensor == "w" && expected == &[32, 2] && found == &[32, 1]),
            "{e}"
        );
    }

    #[test]
    fn every_truncation_is_an_error() {
        let bytes = sample().bytes();
        assert!(GgufFile::from_bytes("full.gguf", bytes.clone()).is_ok());
        for len in 0..bytes.len() {
            let r = GgufFile::from_bytes("cut.gguf", bytes[..len].to_vec());
            match r {
                Err(LoadError::Truncated { .. } | LoadError::TensorOutOfBounds { .. }) => {}
                Err(e) => panic!("cut at {len}: unexpected error kind {e}"),
                Ok(_) => panic!("cut at {len} of {} parsed", bytes.len()),
            }
        }
    }

    #[test]
    fn truncated_file_on_disk_is_an_error() {
        let dir = std::env::temp_dir().join(format!("laya-gguf-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bytes = sample().bytes();
        for (i, len) in [0, 3, 4, 24, bytes.len() - 1].into_iter().enumerate() {
            let p = dir.join(format!("cut{i}.gguf"));
            std::fs::write(&p, &bytes[..len]).unwrap();
            let e = GgufFile::open(&p).unwrap_err();
            assert!(e.to_string().contains(&p.display().to_string()), "{e}");
        }
        let p = dir.join("whole.gguf");
        std::fs::write(&p, &bytes).unwrap();
        assert_eq!(GgufFile::open(&p).unwrap().dequantize("h").unwrap(), [1.0, -0.5]);
        let missing = GgufFile::open(dir.join("absent.gguf")).unwrap_err();
        assert!(matches!(missing, LoadError::Io { .. }));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn wrong_magic_and_version_are_rejected() {
        let mut bytes = sample().bytes();
        bytes[0] = b'X';
        let e = GgufFile::from_bytes("m.gguf", bytes).unwrap_err();
        assert!(matches!(e, LoadError::BadMagic { .. }), "{e}");
        for v in [1u32, 4, 0x0300_0000] {
            let mut bytes = sample().bytes();
            bytes[4..8].copy_from_slice(&v.to_le_bytes());
            let e = GgufFile::from_bytes("v.gguf", bytes).unwrap_err();
            assert!(matches!(e, LoadError::UnsupportedVersion { version, .. } if version == v));
        }
    }

    #[test]
    fn unknown_type_id_names_the_tensor() {
        let mut w = GgufWriter::new();
        w.tensors
            .push(("blk.0.mystery".into(), vec![32], 31, vec![0; 32]));
        let e = GgufFile::from_bytes("t.gguf", w.bytes()).unwrap_err();
        assert!(
            matches!(&e, LoadError::UnknownType { tensor, type_id: 31, .. } if tensor == "blk.0.mystery"),
            "{e}"
        );
        assert!(e.to_string().contains("blk.0.mystery") && e.to_string().contains("t.gguf"));
    }

    #[test]
    fn hostile_counts_and_shapes_are_rejected_without_allocating() {
        // Header claiming 2^62 tensors / KV pairs.
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend((1u64 << 62).to_le_bytes());
        b.extend(0u64.to_le_bytes());
        assert!(matches!(
            GgufFile::from_bytes("n.gguf", b),
            Err(LoadError::Truncated { .. })
        ));
        let mut b = b"GGUF".to_vec();
        b.extend(3u32.to_le_bytes());
        b.extend(0u64.to_le_bytes());
        b.extend(u64::MAX.to_le_bytes());
        assert!(matches!(
            GgufFile::from_bytes("n.gguf", b),
            Err(LoadError::Truncated { .. })
        ));
        // A string claiming u64::MAX bytes, an array claiming 2^60 strings.
        let mut w = GgufWriter::new();
        w.raw("s", 8, &u64::MAX.to_le_bytes());
        assert!(matches!(
            GgufFile::from_bytes("s.gguf", w.bytes()),
            Err(LoadError::Truncated { .. })
        ));
        let mut w = GgufWriter::new();
        let mut a = 8u32.to_le_bytes().to_vec();
        a.extend((1u64 << 60).to_le_bytes());
        w.raw("a", 9, &a);
        assert!(matches!(
            GgufFile::from_bytes("a.gguf", w.bytes()),
            Err(LoadError::Truncated { .. })
        ));
        // Arrays nested 10_000 deep (would overflow the stack if followed).
        let mut w = GgufWriter::new();
        let mut a = Vec::new();
        for _ in 0..10_000 {
            a.extend(9u32.to_le_bytes());
            a.extend(1u64.to_le_bytes());
        }
        w.raw("deep", 9, &a);
        assert!(matches!(
            GgufFile::from_bytes("d.gguf", w.bytes()),
            Err(LoadError::Malformed { .. })
        ));
        // Overflowing dims, too many dims, ne0 not a whole number of blocks.
        for (dims, ty) in [
            (vec![1u64 << 32, 1 << 32], GgmlType::F32),
            (vec![1, 1, 1, 1, 1], GgmlType::F32),
            (vec![16], GgmlType::Q8_0),
        ] {
            let mut w = GgufWriter::new();
            w.tensor("t", &dims, ty, vec![0; 64]);
            let e = GgufFile::from_bytes("x.gguf", w.bytes()).unwrap_err();
            assert!(matches!(e, LoadError::Malformed { .. }), "{dims:?}: {e}");
        }
        // A tensor offset that is not a multiple of the alignment.
        let mut w = sample();
        w.offset_shift = 4;
        let e = GgufFile::from_bytes("mis.gguf", w.bytes()).unwrap_err();
        assert!(matches!(e, LoadError::Malformed { .. }), "{e}");
        // Tensor data claimed past the end of the file.
        let mut w = GgufWriter::new();
        w.tensor("big", &[1 << 20], GgmlType::F32, vec![0; 64]);
        let e = GgufFile::from_bytes("o.gguf", w.bytes()).unwrap_err();
        assert!(
            matches!(&e, LoadError::TensorOutOfBounds { tensor, .. } if tensor == "big"),
            "{e}"
        );
        // Duplicate tensor names and keys.
        let mut w = GgufWriter::new();
        w.tensor("t", &[1], GgmlType::F32, vec![0; 4]);
        w.tensor("t", &[1], GgmlType::F32, vec![0; 4]);
        assert!(matches!(
            GgufFile::from_bytes("d.gguf", w.bytes()),
            Err(LoadError::Malformed { .. })
        ));
        let mut w = GgufWriter::new();
        w.u32("k", 1).u32("k", 2);
        assert!(matches!(
            GgufFile::from_bytes("d.gguf", w.bytes()),
            Err(LoadError::Malformed { .. })
        ));
        // Bad alignment value.
        let mut w = sample();
        w.u32("general.alignment", 48);
        assert!(matches!(
            GgufFile::from_bytes("al.gguf", w.bytes()),
            Err(LoadError::Malformed { .. })
        ));
    }

    /// Random byte corruptions of a valid file must give Ok or Err, never a panic; whatever
    /// parses must also dequantize or fail cleanly.
    #[test]
    fn corrupted_files_never_panic() {
        let clean = sample().bytes();
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..20_000 {
            let mut b = clean.clone();
            for _ in 0..1 + next() % 4 {
                let i = (next() as usize) % b.len();
                b[i] = match next() % 3 {
                    0 => next() as u8,
                    1 => 0xFF,
                    _ => b[i] ^ (1 << (next() % 8)),
                };
            }
            if let Ok(f) = GgufFile::from_bytes("fuzz.gguf", b) {
                for t in f.tensors() {
                    let _ = f.dequantize(t.name());
                }
            }
        }
    }

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn real_05b_model_header_matches_models_md() {
        let Some(path) = real_model_path(MODEL_05B) else {
            return;
        };
        let f = GgufFile::open(path).unwrap();
        assert_eq!(f.version(), 3);
        assert_eq!(f.tensors().len(), 291);
        assert_eq!(f.metadata().len(), 26);
        assert_eq!(f.alignment(), 32);
        assert!(f.get("general.alignment").is_none());
        assert_eq!(f.data_offset(), 5_947_776);
        assert_eq!(f.get_str("general.architecture").unwrap(), "qwen2");
        assert_eq!(f.get_u32("general.file_type").unwrap(), 15);
        assert_eq!(f.get_u32("qwen2.block_count").unwrap(), 24);
        assert_eq!(f.get_u32("qwen2.embedding_length").unwrap(), 896);
        assert_eq!(f.get_u32("qwen2.feed_forward_length").unwrap(), 4864);
        assert_eq!(f.get_u32("qwen2.attention.head_count").unwrap(), 14);
        assert_eq!(f.get_u32("qwen2.attention.head_count_kv").unwrap(), 2);
        assert_eq!(f.get_u32("qwen2.context_length").unwrap(), 32768);
        assert_eq!(f.get_f32("qwen2.rope.freq_base").unwrap(), 1_000_000.0);
        assert_eq!(
            f.get_f32("qwen2.attention.layer_norm_rms_epsilon").unwrap() as f64,
            9.999999974752427e-07
        );
        assert_eq!(f.get_str_array("tokenizer.ggml.tokens").unwrap().len(), 151_936);
        assert_eq!(f.get_str_array("tokenizer.ggml.merges").unwrap().len(), 151_387);
        assert_eq!(
            f.get_i32_array("tokenizer.ggml.token_type").unwrap().len(),
            151_936
        );
        assert!(!f.get_bool("tokenizer.ggml.add_bos_token").unwrap());

        let mut counts = std::collections::BTreeMap::new();
        for t in f.tensors() {
            *counts.entry(t.ty().name()).or_insert(0) += 1;
            assert!(f.tensor_bytes(t).is_ok());
        }
        let expected: std::collections::BTreeMap<_, _> = [
            ("F32", 121),
            ("Q5_0", 133),
            ("Q8_0", 13),
            ("Q6_K", 12),
            ("Q4_K", 12),
        ]
        .into();
        assert_eq!(counts, expected);
        let emb = f.expect_shape("token_embd.weight", &[896, 151_936]).unwrap();
        assert_eq!(emb.ty(), GgmlType::Q5_0);
        assert_eq!(f.tensor("output.weight").unwrap().ty(), GgmlType::Q8_0);
    }

    /// Whole tensors of the real model against checksums gguf-py computed
    /// (scripts/gen_dequant_fixture.py): exact first/last values and exact bit-pattern sums.
    #[test]
    fn real_05b_tensors_match_gguf_py_checksums() {
        let Some(path) = real_model_path(MODEL_05B) else {
            return;
        };
        let f = GgufFile::open(path).unwrap();
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/data/dequant_blocks.json"
        );
        let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let entries = doc["tensors"].as_array().unwrap();
        let mut types = std::collections::BTreeSet::new();
        for e in entries {
            let name = e["name"].as_str().unwrap();
            let info = f.tensor(name).unwrap();
            assert_eq!(info.ty().name(), e["type"].as_str().unwrap(), "{name}");
            let dims: Vec<u64> = e["dims"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap())
                .collect();
            assert_eq!(info.dims(), dims, "{name}");
            let x = f.dequantize(name).unwrap();
            assert_eq!(x.len() as u64, e["n_elements"].as_u64().unwrap());

            let bits = |s: &str| -> Vec<u32> {
                hex(s)
                    .chunks_exact(4)
                    .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
                    .collect()
            };
            let got_first: Vec<u32> = x[..8].iter().map(|v| v.to_bits()).collect();
            let got_last: Vec<u32> = x[x.len() - 8..].iter().map(|v| v.to_bits()).collect();
            assert_eq!(
                got_first,
                bits(e["first8_f32_hex"].as_str().unwrap()),
                "{name} first 8"
            );
            assert_eq!(
                got_last,
                bits(e["last8_f32_hex"].as_str().unwrap()),
                "{name} last 8"
            );

            let (mut bsum, mut wsum) = (0u64, 0u64);
            let (mut sum, mut sum_sq) = (0f64, 0f64);
            for (i, v) in x.iter().enumerate() {
                let b = u64::from(v.to_bits());
                bsum = bsum.wrapping_add(b);
                wsum = wsum.wrapping_add(b.wrapping_mul(i as u64 + 1));
                let v = f64::from(*v);
                sum += v;
                sum_sq += v * v;
            }
            assert_eq!(bsum, e["bits_sum_u64"].as_u64().unwrap(), "{name} bit sum");
            assert_eq!(
                wsum,
                e["bits_weighted_sum_u64"].as_u64().unwrap(),
                "{name} weighted bit sum"
            );
            // numpy sums pairwise, we sum sequentially: equal up to f64 rounding.
            let (es, esq) = (e["sum"].as_f64().unwrap(), e["sum_sq"].as_f64().unwrap());
            assert!(
                (sum - es).abs() <= 1e-9 * esq.max(1.0),
                "{name} sum {sum} vs {es}"
            );
            assert!(
                (sum_sq - esq).abs() <= 1e-9 * esq,
                "{name} sum_sq {sum_sq} vs {esq}"
            );
            types.insert(info.ty().name());
        }
        for t in ["Q4_K", "Q5_0", "Q6_K", "Q8_0"] {
            assert!(types.contains(t), "no whole-tensor check for {t}");
        }
    }

    /// Every tensor of the real 0.5B model dequantizes to finite values (one reused buffer, so
    /// the printed time is the kernels', not the allocator's).
    #[test]
    fn real_05b_model_dequantizes_completely() {
        let Some(path) = real_model_path(MODEL_05B) else {
            return;
        };
        let f = GgufFile::open(path).unwrap();
        let max = f.tensors().iter().map(|t| t.n_elements()).max().unwrap() as usize;
        let mut buf = vec![0.0f32; max];
        let mut total = 0u64;
        let start = std::time::Instant::now();
        for t in f.tensors() {
            let n = t.n_elements() as usize;
            let out = &mut buf[..n];
            dequant::dequantize(t.ty(), f.tensor_bytes(t).unwrap(), n, out).unwrap();
            assert!(
                out.iter().all(|v| v.is_finite()),
                "{} has non-finite values",
                t.name()
            );
            total += t.n_elements();
        }
        eprintln!(
            "dequantized + checked {total} values of {} tensors in {:?}",
            f.tensors().len(),
            start.elapsed()
        );
        assert_eq!(total, 630_167_424);
    }
}

//! Opening a GGUF file: the header is checked and its tensor descriptions read here, candle parses
//! the metadata values, the tensor data is memory-mapped and viewed in place (no copy of the
//! weights), and every way a file can be wrong becomes a message. Tensors come out as views (type,
//! shape, bytes); `weights` makes the model's matrices of them.
//!
//! The tensor descriptions are ours, not candle's: candle 0.11 refuses a whole file when one
//! tensor has a type it does not know (MXFP4, ggml type 39, which every gpt-oss file has for its
//! experts), and its descriptions carry its `GgmlDType`, which cannot name MXFP4. They are the
//! simplest part of the header (name, shape, type number, offset) and `preflight` walks them
//! anyway to check them, so it reads them into our table, each with a `TensorType` (candle's type
//! or MXFP4). Candle is handed the header cut at the end of the metadata with its tensor count
//! read as zero (`MetadataOnly`), and keeps parsing every metadata value into its `Value`, which
//! the rest of pld reads; the data offset (the end of the descriptions rounded up to
//! `general.alignment`) is computed here. A type number neither candle nor pld knows is refused at
//! open, naming the tensor.

use crate::error::{EngineError, Result};
use crate::kernels::{Bytes, TensorType};
use candle_core::quantized::gguf_file::{Content, Value};
use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One tensor of the file, in place.
pub struct TensorView<'a> {
    pub name: &'a str,
    pub dtype: TensorType,
    /// As candle reads them: a matrix's rows, then its columns.
    pub dims: &'a [usize],
    /// A window into the mapped file (`open` checked that it lies inside).
    pub bytes: Bytes,
}

/// Where a tensor lies and what it holds.
struct TensorInfo {
    dtype: TensorType,
    /// Outermost first (GGUF stores them innermost first).
    dims: Vec<usize>,
    /// From the start of the data.
    offset: u64,
    /// Bytes of its data.
    len: u64,
}

pub struct GgufFile {
    pub path: PathBuf,
    pub metadata: HashMap<String, Value>,
    tensors: HashMap<String, TensorInfo>,
    /// Where the tensor data starts in the file.
    data_offset: u64,
    map: Arc<memmap2::Mmap>,
}

/// Where tensor data is aligned when `general.alignment` does not say.
const DEFAULT_ALIGNMENT: u64 = 32;

impl GgufFile {
    pub fn open(path: &Path) -> Result<Self> {
        if !path.exists() {
            return Err(EngineError::ModelNotFound(path.to_path_buf()));
        }
        let bad = |reason: String| EngineError::BadModelFile {
            path: path.to_path_buf(),
            reason,
        };
        let file = std::fs::File::open(path).map_err(|e| bad(e.to_string()))?;
        if file.metadata().map(|m| m.is_dir()).unwrap_or(false) {
            return Err(bad("it is a directory, not a .gguf file".into()));
        }
        // SAFETY: the file is opened read-only and mapped read-only; like every engine that maps
        // its weights, we rely on nobody truncating the model file while it is in use.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| bad(e.to_string()))?;
        // Counts and lengths are checked against the file before anything is allocated for them.
        let header = preflight(&map).map_err(bad)?;
        // Parsed from the mapped bytes: reading the file itself would take one system call per
        // value (a quarter of a million vocabulary strings for Gemma).
        let mut reader = MetadataOnly {
            bytes: &map[..header.metadata_end],
            pos: 0,
            count: header.tensor_count_at.clone(),
        };
        let metadata = Content::read(&mut reader)
            .map_err(|e| bad(format!("not a valid GGUF file ({e})")))?
            .metadata;
        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(v) => value_to_u64(v)
                .filter(|a| a.is_power_of_two())
                .ok_or_else(|| bad("general.alignment is not a power of two".into()))?,
        };
        let file_len = map.len() as u64;
        let data_offset = header
            .descriptions_end
            .checked_next_multiple_of(alignment)
            .unwrap_or(u64::MAX);
        let mut tensors = HashMap::with_capacity(header.tensors.len());
        for t in header.tensors {
            let dtype = TensorType::from_ggml_code(t.code).ok_or_else(|| {
                EngineError::UnsupportedTensorType {
                    name: t.name.clone(),
                    dtype: format!("ggml type {}", t.code),
                }
            })?;
            // At most 2^40 elements (`preflight`): the size cannot overflow.
            let elems: u64 = t.dims.iter().product();
            let len = elems / dtype.block_size() as u64 * dtype.type_size() as u64;
            let end = data_offset
                .checked_add(t.offset)
                .and_then(|e| e.checked_add(len))
                .unwrap_or(u64::MAX);
            if end > file_len {
                return Err(bad(format!(
                    "file is truncated: tensor '{}' ends at byte {end}, the file has {file_len} bytes",
                    t.name
                )));
            }
            let dims = t.dims.iter().rev().map(|&d| d as usize).collect();
            tensors.insert(
                t.name,
                TensorInfo {
                    dtype,
                    dims,
                    offset: t.offset,
                    len,
                },
            );
        }
        Ok(GgufFile {
            path: path.to_path_buf(),
            metadata,
            tensors,
            data_offset,
            map: Arc::new(map),
        })
    }

    pub fn meta(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }
    fn meta_required(&self, key: &str) -> Result<&Value> {
        self.meta(key)
            .ok_or_else(|| EngineError::BadMetadata(format!("missing key '{key}'")))
    }

    pub fn get_u64(&self, key: &str) -> Result<u64> {
        let v = self.meta_required(key)?;
        value_to_u64(v)
            .ok_or_else(|| EngineError::BadMetadata(format!("'{key}' is not an integer")))
    }

    pub fn get_u64_opt(&self, key: &str) -> Option<u64> {
        self.meta(key).and_then(value_to_u64)
    }

    pub fn get_f32_opt(&self, key: &str) -> Option<f32> {
        match self.meta(key)? {
            Value::F32(v) => Some(*v),
            Value::F64(v) => Some(*v as f32),
            other => value_to_u64(other).map(|v| v as f32),
        }
    }

    pub fn get_bool_opt(&self, key: &str) -> Option<bool> {
        match self.meta(key)? {
            Value::Bool(b) => Some(*b),
            other => value_to_u64(other).map(|v| v != 0),
        }
    }

    pub fn get_str(&self, key: &str) -> Result<&str> {
        match self.meta_required(key)? {
            Value::String(s) => Ok(s),
            _ => Err(EngineError::BadMetadata(format!("'{key}' is not a string"))),
        }
    }

    pub fn get_str_opt(&self, key: &str) -> Option<&str> {
        match self.meta(key)? {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn get_array(&self, key: &str) -> Result<&Vec<Value>> {
        match self.meta_required(key)? {
            Value::Array(a) => Ok(a),
            _ => Err(EngineError::BadMetadata(format!("'{key}' is not an array"))),
        }
    }

    pub fn has_tensor(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// The tensor `name`, viewed in the mapped file.
    pub fn tensor(&self, name: &str) -> Result<TensorView<'_>> {
        let (name, info) = self
            .tensors
            .get_key_value(name)
            .ok_or_else(|| EngineError::BadMetadata(format!("missing tensor '{name}'")))?;
        // Inside the file (checked by `open`), so these fit in usize.
        let bytes = Bytes::Mapped {
            map: self.map.clone(),
            start: (self.data_offset + info.offset) as usize,
            len: info.len as usize,
        };
        Ok(TensorView {
            name,
            dtype: info.dtype,
            dims: &info.dims,
            bytes,
        })
    }

    pub fn tensor_dtype(&self, name: &str) -> Option<TensorType> {
        self.tensors.get(name).map(|i| i.dtype)
    }
}

fn value_to_u64(v: &Value) -> Option<u64> {
    Some(match v {
        Value::U8(x) => *x as u64,
        Value::I8(x) => u64::try_from(*x).ok()?,
        Value::U16(x) => *x as u64,
        Value::I16(x) => u64::try_from(*x).ok()?,
        Value::U32(x) => *x as u64,
        Value::I32(x) => u64::try_from(*x).ok()?,
        Value::U64(x) => *x,
        Value::I64(x) => u64::try_from(*x).ok()?,
        Value::Bool(b) => *b as u64,
        _ => return None,
    })
}

/// One tensor description as the header has it.
pub struct RawTensor {
    pub name: String,
    /// Innermost first, as GGUF stores them.
    pub dims: Vec<u64>,
    /// ggml's type number.
    pub code: u32,
    pub offset: u64,
}

/// What `preflight` found.
pub struct Header {
    /// Where the tensor count lies (bytes 8..16, or 8..12 in GGUF 1).
    pub tensor_count_at: std::ops::Range<usize>,
    /// Where the metadata ends and the tensor descriptions begin.
    pub metadata_end: usize,
    /// Where the tensor descriptions end.
    pub descriptions_end: u64,
    pub tensors: Vec<RawTensor>,
}

/// Walks the header of a GGUF file (metadata and tensor descriptions), refusing counts, lengths
/// and shapes the file cannot hold before anything is allocated for them: a corrupt or hostile
/// header becomes an error here instead of a huge allocation or an overflow in the parser that
/// follows. Returns the tensor descriptions (their count checked against the file first) and
/// where the parts of the header lie.
pub fn preflight(bytes: &[u8]) -> std::result::Result<Header, String> {
    let mut r = Reader {
        bytes,
        at: 0,
        wide: true,
    };
    if r.u32()? != 0x4655_4747 {
        return Err("not a GGUF file (wrong magic number)".into());
    }
    let version = r.u32()?;
    if !(1..=3).contains(&version) {
        return Err(format!("GGUF version {version} is not supported (1 to 3)"));
    }
    r.wide = version > 1;
    let tensor_count_at = 8..if r.wide { 16 } else { 12 };
    let tensors = r.count()?;
    let kvs = r.count()?;
    // The smallest key/value pair takes 13 bytes, the smallest tensor description 24.
    r.fits(kvs, 13, "metadata entries")?;
    for _ in 0..kvs {
        r.string()?;
        let ty = r.u32()?;
        r.value(ty, 0)?;
    }
    let metadata_end = r.at;
    r.fits(tensors, 24, "tensors")?;
    let mut out = Vec::with_capacity(tensors as usize);
    for _ in 0..tensors {
        let name = r.string()?;
        // As candle reads names: trailing NULs dropped, invalid UTF-8 replaced.
        let end = name.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        let name = String::from_utf8_lossy(&name[..end]).into_owned();
        let n = r.u32()?;
        if n > 4 {
            return Err(format!("a tensor has {n} dimensions (at most 4)"));
        }
        let mut dims = Vec::with_capacity(n as usize);
        let mut elems: u64 = 1;
        for _ in 0..n {
            let d = r.count()?;
            elems = elems
                .checked_mul(d)
                .filter(|&e| e <= 1 << 40)
                .ok_or("a tensor's shape is impossibly large")?;
            dims.push(d);
        }
        let code = r.u32()?;
        let offset = r.u64()?;
        out.push(RawTensor {
            name,
            dims,
            code,
            offset,
        });
    }
    Ok(Header {
        tensor_count_at,
        metadata_end,
        descriptions_end: r.at as u64,
        tensors: out,
    })
}

/// The header as candle is given it: the bytes up to the end of the metadata, the tensor count
/// (at `count`) read as zero, so that candle parses the metadata alone.
struct MetadataOnly<'a> {
    bytes: &'a [u8],
    pos: u64,
    count: std::ops::Range<usize>,
}

impl Read for MetadataOnly<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let at = (self.pos as usize).min(self.bytes.len());
        let n = buf.len().min(self.bytes.len() - at);
        buf[..n].copy_from_slice(&self.bytes[at..at + n]);
        for i in self.count.clone() {
            if (at..at + n).contains(&i) {
                buf[i - at] = 0;
            }
        }
        self.pos += n as u64;
        Ok(n)
    }
}

impl Seek for MetadataOnly<'_> {
    fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
        let (base, delta) = match to {
            SeekFrom::Start(n) => (0, n as i128),
            SeekFrom::End(d) => (self.bytes.len() as i128, d as i128),
            SeekFrom::Current(d) => (self.pos as i128, d as i128),
        };
        let pos = u64::try_from(base + delta).map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "seek before the start")
        })?;
        self.pos = pos;
        Ok(pos)
    }
}

/// A cursor over the header bytes; every read checks that the bytes are there.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    /// Counts and lengths are 64-bit (GGUF 2 and 3) or 32-bit (GGUF 1).
    wide: bool,
}

impl Reader<'_> {
    fn take(&mut self, n: u64) -> std::result::Result<&[u8], String> {
        let left = (self.bytes.len() - self.at) as u64;
        if n > left {
            return Err(format!(
                "header is truncated or corrupt: {n} bytes wanted at byte {}, {left} left",
                self.at
            ));
        }
        let out = &self.bytes[self.at..self.at + n as usize];
        self.at += n as usize;
        Ok(out)
    }

    fn u32(&mut self) -> std::result::Result<u32, String> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> std::result::Result<u64, String> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    fn count(&mut self) -> std::result::Result<u64, String> {
        if self.wide {
            self.u64()
        } else {
            self.u32().map(u64::from)
        }
    }

    /// Fails unless `count` items of at least `size` bytes each fit in what is left.
    fn fits(&self, count: u64, size: u64, what: &str) -> std::result::Result<(), String> {
        let left = (self.bytes.len() - self.at) as u64;
        if count.checked_mul(size).is_none_or(|n| n > left) {
            return Err(format!(
                "header claims {count} {what}, more than the file's {left} remaining bytes can hold"
            ));
        }
        Ok(())
    }

    fn string(&mut self) -> std::result::Result<&[u8], String> {
        let len = self.count()?;
        self.take(len)
    }

    fn value(&mut self, ty: u32, depth: usize) -> std::result::Result<(), String> {
        let fixed = match ty {
            0 | 1 | 7 => 1,
            2 | 3 => 2,
            4..=6 => 4,
            10..=12 => 8,
            8 => return self.string().map(|_| ()),
            9 => {
                if depth > 4 {
                    return Err("metadata arrays nested too deeply".into());
                }
                let inner = self.u32()?;
                let count = self.count()?;
                let min = match inner {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    8 | 10..=12 => {
                        if self.wide {
                            8
                        } else {
                            4
                        }
                    }
                    9 => 12,
                    other => return Err(format!("unknown metadata value type {other}")),
                };
                self.fits(count, min, "array elements")?;
                for _ in 0..count {
                    self.value(inner, depth + 1)?;
                }
                return Ok(());
            }
            other => return Err(format!("unknown metadata value type {other}")),
        };
        self.take(fixed).map(|_| ())
    }
}

//! Opening a GGUF file: candle parses the header and metadata, the tensor data is memory-mapped and
//! viewed in place (no copy of the weights), and every way a file can be wrong becomes a message.
//! Tensors come out as views (type, shape, bytes); `weights` makes the model's matrices of them.

use crate::error::{EngineError, Result};
use crate::kernels::Bytes;
use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::GgmlDType;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One tensor of the file, in place.
pub struct TensorView<'a> {
    pub name: &'a str,
    pub dtype: GgmlDType,
    /// As candle reads them: a matrix's rows, then its columns.
    pub dims: &'a [usize],
    /// A window into the mapped file (`open` checked that it lies inside).
    pub bytes: Bytes,
}

pub struct GgufFile {
    pub path: PathBuf,
    pub content: Content,
    map: Arc<memmap2::Mmap>,
}

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
        // Counts and lengths are checked against the file before candle allocates for them.
        preflight(&map).map_err(bad)?;
        // Parsed from the mapped bytes: reading the file itself would take one system call per
        // value (a quarter of a million vocabulary strings for Gemma).
        let content = Content::read(&mut std::io::Cursor::new(&map[..])).map_err(|e| {
            let msg = e.to_string();
            if msg.contains("magic") {
                bad("not a GGUF file (wrong magic number)".into())
            } else if let Some(code) = msg.strip_prefix("unknown dtype for tensor ") {
                EngineError::UnsupportedTensorType {
                    name: "(a tensor)".into(),
                    dtype: format!("ggml type {code}"),
                }
            } else {
                bad(format!("not a valid GGUF file ({msg})"))
            }
        })?;
        let file_len = map.len() as u64;
        for (name, info) in &content.tensor_infos {
            let elems = info.shape.elem_count();
            let bs = info.ggml_dtype.block_size();
            let size = (elems / bs) as u64 * info.ggml_dtype.type_size() as u64;
            let end = content
                .tensor_data_offset
                .checked_add(info.offset)
                .and_then(|e| e.checked_add(size))
                .unwrap_or(u64::MAX);
            if end > file_len {
                return Err(bad(format!(
                    "file is truncated: tensor '{name}' ends at byte {end}, the file has {file_len} bytes"
                )));
            }
        }
        Ok(GgufFile {
            path: path.to_path_buf(),
            content,
            map: Arc::new(map),
        })
    }

    pub fn meta(&self, key: &str) -> Option<&Value> {
        self.content.metadata.get(key)
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
        self.content.tensor_infos.contains_key(name)
    }

    /// The tensor `name`, viewed in the mapped file.
    pub fn tensor(&self, name: &str) -> Result<TensorView<'_>> {
        let (name, info) = self
            .content
            .tensor_infos
            .get_key_value(name)
            .ok_or_else(|| EngineError::BadMetadata(format!("missing tensor '{name}'")))?;
        let dtype = info.ggml_dtype;
        let bytes = Bytes::Mapped {
            map: self.map.clone(),
            start: (self.content.tensor_data_offset + info.offset) as usize,
            len: info.shape.elem_count() / dtype.block_size() * dtype.type_size(),
        };
        Ok(TensorView {
            name,
            dtype,
            dims: info.shape.dims(),
            bytes,
        })
    }

    pub fn tensor_dtype(&self, name: &str) -> Option<GgmlDType> {
        self.content.tensor_infos.get(name).map(|i| i.ggml_dtype)
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

/// Walks the header of a GGUF file (metadata and tensor descriptions) without allocating for
/// anything it reads, and refuses counts, lengths and shapes the file cannot hold: a corrupt or
/// hostile header becomes an error here instead of a huge allocation or an overflow in the
/// parser that follows.
pub fn preflight(bytes: &[u8]) -> std::result::Result<(), String> {
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
    let tensors = r.count()?;
    let kvs = r.count()?;
    // The smallest key/value pair takes 13 bytes, the smallest tensor description 24.
    r.fits(kvs, 13, "metadata entries")?;
    for _ in 0..kvs {
        r.string()?;
        let ty = r.u32()?;
        r.value(ty, 0)?;
    }
    r.fits(tensors, 24, "tensors")?;
    for _ in 0..tensors {
        r.string()?;
        let dims = r.u32()?;
        if dims > 4 {
            return Err(format!("a tensor has {dims} dimensions (at most 4)"));
        }
        let mut elems: u64 = 1;
        for _ in 0..dims {
            let d = r.count()?;
            elems = elems
                .checked_mul(d)
                .filter(|&e| e <= 1 << 40)
                .ok_or("a tensor's shape is impossibly large")?;
        }
        r.u32()?; // type
        r.u64()?; // offset
    }
    Ok(())
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

    fn string(&mut self) -> std::result::Result<(), String> {
        let len = self.count()?;
        self.take(len).map(|_| ())
    }

    fn value(&mut self, ty: u32, depth: usize) -> std::result::Result<(), String> {
        let fixed = match ty {
            0 | 1 | 7 => 1,
            2 | 3 => 2,
            4..=6 => 4,
            10..=12 => 8,
            8 => return self.string(),
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

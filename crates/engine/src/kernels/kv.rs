//! The KV cache's stored types, one list: `KvDtype` (what a cache holds, as the CLI, the server
//! and Python name it), the numbers a head is stored in (`KvStored`, `KvElem`: f32, f16, bf16, and
//! q8's bytes), a head of a cache as the attention kernels take it (`KvHead`, typed: `KvOf`), and
//! which of its positions a query row sees (`Visible`, `TreeMask`).
//!
//! A new KV type is a variant here (`KvDtype`, `KvElems`, with its `KvStored`), its format module
//! if it has one (as `q8`), and its attention in each class's table (`Kernels::attend`).

use super::q8;
use half::{bf16, f16};

/// The number type a cache stores its keys and values in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvDtype {
    /// Half precision: half the memory and the bytes attention reads.
    F16,
    /// bfloat16 (f32's range, 8 bits of precision): half the memory, and on AMX the attention
    /// products run on tiles. The default where they do (`KvDtype::auto`).
    Bf16,
    /// Single precision: every digit the pass computed.
    F32,
    /// llama.cpp's `q8_0` in spirit: each block of 32 numbers an int8 times an f16 scale, 8.5
    /// bits a number. Heads of a multiple of 32 dimensions.
    Q8,
}

impl KvDtype {
    /// Every type, in the order `--kv-cache-dtype` lists them.
    pub const ALL: [KvDtype; 4] = [KvDtype::F16, KvDtype::Bf16, KvDtype::F32, KvDtype::Q8];

    /// What a setting may say: `auto` (the model's default on the class in use) or a type's name.
    pub const SETTINGS: [&'static str; 5] = ["auto", "f16", "bf16", "f32", "q8_0"];

    /// Bytes of one stored number (q8: of its int8; `stored` counts its scales).
    pub fn bytes(self) -> usize {
        match self {
            KvDtype::Q8 => 1,
            KvDtype::F16 | KvDtype::Bf16 => 2,
            KvDtype::F32 => 4,
        }
    }

    /// Stored numbers of one position of a head of `hd` dimensions, its key or its value: `hd`,
    /// and for q8 two bytes of scale per block of 32 besides.
    pub fn stored(self, hd: usize) -> usize {
        match self {
            KvDtype::Q8 => q8::stored(hd),
            KvDtype::F16 | KvDtype::Bf16 | KvDtype::F32 => hd,
        }
    }

    /// Whether heads of `hd` dimensions can be cached in this type: bf16 pairs dimensions, q8
    /// takes blocks of 32.
    pub fn fits(self, hd: usize) -> bool {
        match self {
            KvDtype::Bf16 => hd.is_multiple_of(2),
            KvDtype::Q8 => q8::fits(hd),
            KvDtype::F16 | KvDtype::F32 => true,
        }
    }

    /// Its name, as `--kv-cache-dtype` spells it.
    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F16 => "f16",
            KvDtype::Bf16 => "bf16",
            KvDtype::F32 => "f32",
            KvDtype::Q8 => "q8_0",
        }
    }

    /// A setting (`SETTINGS`, or another common spelling of a type: `bfloat16`, `float16`,
    /// `float32`, `q8`, `int8`): `None` for `auto`, an error naming the value and the choices otherwise.
    pub fn setting(value: &str) -> Result<Option<KvDtype>, String> {
        match value {
            "auto" => Ok(None),
            v => v.parse().map(Some),
        }
    }
}

impl std::str::FromStr for KvDtype {
    type Err = String;

    /// A type by its name (`name`) or another common spelling of it.
    fn from_str(value: &str) -> Result<KvDtype, String> {
        let alias = match value.to_ascii_lowercase().as_str() {
            "float16" | "half" => "f16",
            "bfloat16" => "bf16",
            "float32" | "float" => "f32",
            "q8" | "int8" => "q8_0",
            _ => "",
        };
        let name = if alias.is_empty() { value } else { alias };
        KvDtype::ALL
            .into_iter()
            .find(|d| d.name().eq_ignore_ascii_case(name))
            .ok_or_else(|| {
                format!(
                    "unknown KV cache type {value:?}: expected one of {}",
                    KvDtype::SETTINGS.join(", ")
                )
            })
    }
}

impl std::fmt::Display for KvDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How a cached number is widened to f32 as the vector kernels load it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ElemKind {
    F32,
    F16,
    Bf16,
}

/// How a cache lays out the numbers of one key/value head: keys transposed (rows of positions,
/// `key_stride` apart), values one position after another (`value_stride` apart). Every cache
/// type, and the bytes of a q8 cache (`q8`), whose rows also hold each block's scale.
pub trait KvStored: Copy + Send + Sync + bytemuck::Pod + 'static {
    /// Whether a head's numbers lie in pairs, as AMX's bf16 tiles take them (bf16): dimensions
    /// `2p` and `2p + 1` of a key side by side along one row of positions, and positions `2k`
    /// and `2k + 1` of the values side by side along one row of dimensions.
    const PAIRED: bool = false;

    /// Where dimension `i` of key `t` lies among a head's keys (rows `key_stride` apart):
    /// `i * key_stride + t`, or paired, `(i / 2) * 2 * key_stride + 2 * t + i % 2`.
    #[inline(always)]
    fn key_at(i: usize, t: usize, key_stride: usize) -> usize {
        if Self::PAIRED {
            (i / 2) * 2 * key_stride + 2 * t + i % 2
        } else {
            i * key_stride + t
        }
    }

    /// Where dimension `d` of value `t` lies among a head's values (`value_stride` per
    /// position): `t * value_stride + d`, or paired, `(t / 2) * 2 * value_stride + 2 * d + t % 2`.
    #[inline(always)]
    fn value_at(t: usize, d: usize, value_stride: usize) -> usize {
        if Self::PAIRED {
            (t / 2) * 2 * value_stride + 2 * d + t % 2
        } else {
            t * value_stride + d
        }
    }
}

impl KvStored for f32 {}
impl KvStored for f16 {}
impl KvStored for bf16 {
    const PAIRED: bool = true;
}
impl KvStored for u8 {}

/// A number type the KV cache stores keys and values in, one number per element: f32, f16 or
/// bf16, no other (the vector kernels load by `KIND`). A q8 cache's blocks are not numbers of
/// their own; its heads are dequantized for the kernels (`q8`).
pub trait KvElem: KvStored + sealed::OneOfOurs {
    /// The cache's zero.
    const ZERO: Self;
    /// Which of the three it is.
    const KIND: ElemKind;

    /// `v` rounded to the nearest number of the type (f16 and bf16: out-of-range values saturate
    /// to the largest finite one, so a cache never holds an infinity its attention would turn to
    /// NaN).
    fn from_f32(v: f32) -> Self;
    /// The number, exactly, as f32.
    fn to_f32(self) -> f32;
    /// A head's keys and values of this type, as `KvHead` holds them.
    fn elems<'a>(keys: &'a [Self], values: &'a [Self]) -> KvElems<'a>;
}

mod sealed {
    pub trait OneOfOurs {}
    impl OneOfOurs for f32 {}
    impl OneOfOurs for half::f16 {}
    impl OneOfOurs for half::bf16 {}
}

impl KvElem for f32 {
    const ZERO: f32 = 0.0;
    const KIND: ElemKind = ElemKind::F32;
    #[inline]
    fn from_f32(v: f32) -> f32 {
        v
    }
    #[inline]
    fn to_f32(self) -> f32 {
        self
    }
    fn elems<'a>(keys: &'a [f32], values: &'a [f32]) -> KvElems<'a> {
        KvElems::F32 { keys, values }
    }
}

impl KvElem for f16 {
    const ZERO: f16 = f16::ZERO;
    const KIND: ElemKind = ElemKind::F16;
    #[inline]
    fn from_f32(v: f32) -> f16 {
        f16::from_f32(v.clamp(f16::MIN.to_f32(), f16::MAX.to_f32()))
    }
    #[inline]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    fn elems<'a>(keys: &'a [f16], values: &'a [f16]) -> KvElems<'a> {
        KvElems::F16 { keys, values }
    }
}

impl KvElem for bf16 {
    const ZERO: bf16 = bf16::ZERO;
    const KIND: ElemKind = ElemKind::Bf16;
    #[inline]
    fn from_f32(v: f32) -> bf16 {
        bf16::from_f32(v.clamp(bf16::MIN.to_f32(), bf16::MAX.to_f32()))
    }
    #[inline]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    fn elems<'a>(keys: &'a [bf16], values: &'a [bf16]) -> KvElems<'a> {
        KvElems::Bf16 { keys, values }
    }
}

/// A q8 head as `kernels::q8` lays it out: `hd` dimensions, key rows `ks` bytes apart, `len`
/// positions.
#[derive(Clone, Copy)]
pub(crate) struct Q8Head<'a> {
    pub keys: &'a [u8],
    pub values: &'a [u8],
    pub hd: usize,
    pub ks: usize,
    pub len: usize,
}

/// The keys and values of a `KvHead`, in the type its cache stores.
#[derive(Clone, Copy)]
pub enum KvElems<'a> {
    F32 {
        keys: &'a [f32],
        values: &'a [f32],
    },
    F16 {
        keys: &'a [f16],
        values: &'a [f16],
    },
    Bf16 {
        keys: &'a [bf16],
        values: &'a [bf16],
    },
    /// A q8 cache's bytes (`q8`): int8 numbers and each block's f16 scale.
    Q8 {
        keys: &'a [u8],
        values: &'a [u8],
    },
}

/// One key/value head of a cache over its first `len` positions. Keys are stored transposed, one
/// row per dimension: dimension `i` of key `t` is `keys[i * key_stride + t]`, so that the scores
/// of consecutive positions are one vector product away (no horizontal sums); value `t` is
/// `values[t * value_stride..][..hd]`. A bf16 head is paired (`KvElem::key_at`, `value_at`).
/// Position `t` is stored at `t + offset`: 0, or 1 where a paired head skipped an odd number of
/// positions (its values only split between pairs).
#[derive(Clone, Copy)]
pub struct KvHead<'a> {
    pub elems: KvElems<'a>,
    pub key_stride: usize,
    pub value_stride: usize,
    pub hd: usize,
    pub len: usize,
    pub offset: usize,
}

/// A `KvHead` over keys and values of one known type: what the kernels compute with.
#[derive(Clone, Copy)]
pub(crate) struct KvOf<'a, E> {
    pub keys: &'a [E],
    pub values: &'a [E],
    pub key_stride: usize,
    pub value_stride: usize,
    pub hd: usize,
    pub len: usize,
    pub offset: usize,
}

impl<'a> KvHead<'a> {
    /// The head over `keys` and `values` (laid out as above).
    pub fn new<E: KvElem>(
        keys: &'a [E],
        values: &'a [E],
        key_stride: usize,
        value_stride: usize,
        hd: usize,
        len: usize,
    ) -> KvHead<'a> {
        KvHead {
            elems: E::elems(keys, values),
            key_stride,
            value_stride,
            hd,
            len,
            offset: 0,
        }
    }

    /// The same head without its first `n` positions: position `n + t` becomes `t`. A paired
    /// head's values only split between pairs: an odd `n` drops one position fewer from the
    /// slices and offsets the rest by one.
    pub fn skip(self, n: usize) -> KvHead<'a> {
        assert!(n < self.len && self.offset == 0, "skipping every position");
        let (ks, vs) = (self.key_stride, self.value_stride);
        let (elems, dropped) = match self.elems {
            KvElems::F32 { keys, values } => skip_of(keys, values, n, (ks, vs)),
            KvElems::F16 { keys, values } => skip_of(keys, values, n, (ks, vs)),
            KvElems::Bf16 { keys, values } => skip_of(keys, values, n, (ks, vs)),
            KvElems::Q8 { keys, values } => {
                let (keys, values) = (&keys[n..], &values[n * vs..]);
                (KvElems::Q8 { keys, values }, n)
            }
        };
        KvHead {
            elems,
            len: self.len - n,
            offset: n - dropped,
            ..self
        }
    }

    /// The same head over `keys` and `values` of a known type.
    pub(crate) fn of<E>(&self, keys: &'a [E], values: &'a [E]) -> KvOf<'a, E> {
        KvOf {
            keys,
            values,
            key_stride: self.key_stride,
            value_stride: self.value_stride,
            hd: self.hd,
            len: self.len,
            offset: self.offset,
        }
    }
}

/// `KvHead::skip` over keys and values of one type: the slices without their first positions,
/// `n` of them (a paired type's values only split between pairs: `n` rounded down to even), and
/// how many were dropped.
fn skip_of<'a, E: KvElem>(
    keys: &'a [E],
    values: &'a [E],
    n: usize,
    (key_stride, value_stride): (usize, usize),
) -> (KvElems<'a>, usize) {
    let dropped = if E::PAIRED { n / 2 * 2 } else { n };
    let keys = &keys[E::key_at(0, dropped, key_stride)..];
    let values = &values[E::value_at(dropped, 0, value_stride)..];
    (E::elems(keys, values), dropped)
}

/// Which positions one query row sees: every position before `start`, and from `start` on those
/// whose bit is set in `bits` (bit `i` is position `start + i`). A draft tree's node sees the
/// committed cache and its own ancestors (itself included).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Visible {
    pub start: usize,
    pub bits: u64,
}

impl Visible {
    #[inline]
    pub(crate) fn sees(&self, t: usize) -> bool {
        t < self.start || (t - self.start < 64 && (self.bits >> (t - self.start)) & 1 == 1)
    }
}

/// The tree mask of consecutive rows of one pass: row `r` sees what `Visible { start, bits:
/// rows[r] }` says.
#[derive(Clone, Copy, Debug)]
pub struct TreeMask<'a> {
    pub start: usize,
    pub rows: &'a [u64],
}

impl TreeMask<'_> {
    /// What row `r` sees.
    pub(crate) fn row(&self, r: usize) -> Visible {
        Visible {
            start: self.start,
            bits: self.rows[r],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::KvDtype;

    #[test]
    fn kv_types_parse_by_name_and_bad_names_are_named() {
        for d in KvDtype::ALL {
            assert_eq!(d.name().parse::<KvDtype>(), Ok(d));
            assert_eq!(KvDtype::setting(d.name()), Ok(Some(d)));
            assert!(KvDtype::SETTINGS.contains(&d.name()));
        }
        assert_eq!(KvDtype::setting("auto"), Ok(None));
        assert_eq!("bfloat16".parse::<KvDtype>(), Ok(KvDtype::Bf16));
        assert_eq!("Q8".parse::<KvDtype>(), Ok(KvDtype::Q8));
        let e = KvDtype::setting("fp8").unwrap_err();
        assert!(
            e.contains("\"fp8\"") && e.contains("q8_0") && e.contains("auto"),
            "{e}"
        );
    }
}

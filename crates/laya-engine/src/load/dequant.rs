//! Dequantization of ggml tensor data to `f32`.
//!
//! Each kernel follows llama.cpp's reference `dequantize_row_*` (ggml-quants.c) operation by
//! operation, in `f32`, so the output is bit-identical to the C code built without floating-point
//! contraction and to gguf-py's numpy `gguf.quants.dequantize` (the test fixture). Rust never fuses
//! `a * b - c` into an FMA, which is the one freedom a C compiler has here.
//!
//! Blocks never straddle rows (the GGUF reader checks `ne0 % block_size == 0`), so a whole
//! tensor dequantizes as one flat run of blocks, `ne0` fastest.

use std::num::NonZeroUsize;

use half::f16;

use super::ggml_type::GgmlType;

/// Why a buffer could not be dequantized.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DequantError {
    #[error("dequantizing {0} is not supported (supported: {SUPPORTED_NAMES})")]
    Unsupported(GgmlType),
    #[error("{n_elements} elements is not a whole number of {ty} blocks of {block_size}")]
    PartialBlock {
        ty: GgmlType,
        n_elements: usize,
        block_size: usize,
    },
    #[error("{n_elements} {ty} elements take {expected} bytes, the data has {found}")]
    DataSize {
        ty: GgmlType,
        n_elements: usize,
        expected: usize,
        found: usize,
    },
    #[error("output buffer holds {found} values, {expected} are needed")]
    OutputSize { expected: usize, found: usize },
}

const SUPPORTED_NAMES: &str = "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K";

/// Below this many elements a tensor is dequantized on the calling thread.
const PARALLEL_MIN_ELEMENTS: usize = 1 << 20;
const MAX_THREADS: usize = 8;

/// Whether [`dequantize`] handles `ty`.
pub(crate) fn supports(ty: GgmlType) -> bool {
    kernel(ty).is_some()
}

/// Dequantize `n_elements` values of type `ty` from `data` into `out`.
///
/// `data` must hold exactly the bytes of `n_elements / block_size` blocks and `out` exactly
/// `n_elements` values. Large inputs are split by block ranges over the available cores.
pub(crate) fn dequantize(
    ty: GgmlType,
    data: &[u8],
    n_elements: usize,
    out: &mut [f32],
) -> Result<(), DequantError> {
    let threads = std::thread::available_parallelism().map_or(1, NonZeroUsize::get);
    dequantize_with_threads(ty, data, n_elements, out, threads)
}

/// [`dequantize`] with an explicit upper bound on the number of threads (1 = calling thread only).
pub(crate) fn dequantize_with_threads(
    ty: GgmlType,
    data: &[u8],
    n_elements: usize,
    out: &mut [f32],
    threads: usize,
) -> Result<(), DequantError> {
    let kernel = kernel(ty).ok_or(DequantError::Unsupported(ty))?;
    let (block_size, type_size) = (ty.block_size(), ty.type_size());
    if n_elements % block_size != 0 {
        return Err(DequantError::PartialBlock {
            ty,
            n_elements,
            block_size,
        });
    }
    let n_blocks = n_elements / block_size;
    let expected = n_blocks.checked_mul(type_size);
    if expected != Some(data.len()) {
        return Err(DequantError::DataSize {
            ty,
            n_elements,
            expected: expected.unwrap_or(usize::MAX),
            found: data.len(),
        });
    }
    if out.len() != n_elements {
        return Err(DequantError::OutputSize {
            expected: n_elements,
            found: out.len(),
        });
    }

    let threads = threads.min(MAX_THREADS).min(n_elements / PARALLEL_MIN_ELEMENTS);
    if threads <= 1 {
        kernel(data, out);
        return Ok(());
    }
    let blocks_per_thread = n_blocks.div_ceil(threads);
    std::thread::scope(|scope| {
        let parts = data
            .chunks(blocks_per_thread * type_size)
            .zip(out.chunks_mut(blocks_per_thread * block_size));
        for (src, dst) in parts {
            scope.spawn(move || kernel(src, dst));
        }
    });
    Ok(())
}

/// A kernel decodes `k` whole blocks from `src` (`k * type_size` bytes) into `dst` (`k * block_size`).
type Kernel = fn(&[u8], &mut [f32]);

fn kernel(ty: GgmlType) -> Option<Kernel> {
    Some(match ty {
        GgmlType::F32 => dequant_f32,
        GgmlType::F16 => dequant_f16,
        GgmlType::BF16 => dequant_bf16,
        GgmlType::Q4_0 => dequant_q4_0,
        GgmlType::Q4_1 => dequant_q4_1,
        GgmlType::Q5_0 => dequant_q5_0,
        GgmlType::Q5_1 => dequant_q5_1,
        GgmlType::Q8_0 => dequant_q8_0,
        GgmlType::Q4_K => dequant_q4_k,
        GgmlType::Q5_K => dequant_q5_k,
        GgmlType::Q6_K => dequant_q6_k,
        _ => return None,
    })
}

/// Pairs each `N`-byte block of `src` with its `M` outputs; the fixed sizes let the compiler drop
/// bounds checks in the kernels.
fn blocks<'a, const N: usize, const M: usize>(
    src: &'a [u8],
    dst: &'a mut [f32],
) -> impl Iterator<Item = (&'a [u8; N], &'a mut [f32; M])> {
    src.chunks_exact(N).zip(dst.chunks_exact_mut(M)).map(|(b, y)| {
        (
            b.try_into().expect("chunks_exact yields N bytes"),
            y.try_into().expect("chunks_exact_mut yields M values"),
        )
    })
}

#[inline(always)]
fn half_at(b: &[u8], i: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]])).to_f32()
}

fn dequant_f32(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks::<4, 1>(src, dst) {
        y[0] = f32::from_le_bytes(*b);
    }
}

fn dequant_f16(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks::<2, 1>(src, dst) {
        y[0] = f16::from_bits(u16::from_le_bytes(*b)).to_f32();
    }
}

fn dequant_bf16(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks::<2, 1>(src, dst) {
        y[0] = f32::from_bits(u32::from(u16::from_le_bytes(*b)) << 16);
    }
}

/// block_q4_0: d (f16), qs[16]; value = (nibble - 8) * d, low nibbles first.
fn dequant_q4_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks::<18, 32>(src, dst) {
        let d = half_at(b, 0);
        let qs = &b[2..18];
        for j in 0..16 {
            y[j] = ((qs[j] & 0x0F) as i32 - 8) as f32 * d;
            y[j + 16] = ((qs[j] >> 4) as i32 - 8) as f32 * d;
        }
    }
}

/// block_q4_1: d, m (f16), qs[16]; value = nibble * d + m.
fn dequant_q4_1(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks::<20, 32>(src, dst) {
        let (d, m) = (half_at(b, 0), half_at(b, 2));
        let qs = &b[4..20];
        for j in 0..16 {
            y[j] = (qs[j] & 0x0F) as f32 * d + m;
            y[j + 16] = (qs[j] >> 4) as f32 * d + m;
        }
    }
}

/// block_q5_0: d (f16), qh (u32 LE, bit j = 5th bit of value j), qs[16]; value = (q - 16) * d.
fn dequant_q5_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks::<22, 32>(src, dst) {
        let d = half_at(b, 0);
        let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
        let qs = &b[6..22];
        for j in 0..16 {
            let xh0 = (((qh >> j) << 4) & 0x10) as u8;
            let xh1 = ((qh >> (j + 12)) & 0x10) as u8;
            y[j] = (((qs[j] & 0x0F) | xh0) as i32 - 16) as f32 * d;
            y[j + 16] = (((qs[j] >> 4) | xh1) as i32 - 16) as f32 * d;
        }
    }
}

/// block_q5_1: d, m (f16), qh (u32 LE), qs[16]; value = q * d + m.
fn dequant_q5_1(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks::<24, 32>(src, dst) {
        let (d, m) = (half_at(b, 0), half_at(b, 2));
        let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        let qs = &b[8..24];
        for j in 0..16 {
            let xh0 = (((qh >> j) << 4) & 0x10) as u8;
            let xh1 = ((qh >> (j + 12)) & 0x10) as u8;
            y[j] = ((qs[j] & 0x0F) | xh0) as f32 * d + m;
            y[j + 16] = ((qs[j] >> 4) | xh1) as f32 * d + m;
        }
    }
}

/// block_q8_0: d (f16), qs[32] (i8); value = q * d.
fn dequant_q8_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks::<34, 32>(src, dst) {
        let d = half_at(b, 0);
        for j in 0..32 {
            y[j] = (b[2 + j] as i8) as f32 * d;
        }
    }
}

/// The 6-bit scale and min of sub-block `j` (0..8) from the 12 packed bytes of a Q4_K/Q5_K block
/// (ggml's `get_scale_min_k4`).
#[inline(always)]
fn scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// The (d * scale, dmin * min) pairs of the 8 sub-blocks of 32 values.
#[inline(always)]
fn k4_scales(b: &[u8], scales: &[u8; 12]) -> [(f32, f32); 8] {
    let (d, dmin) = (half_at(b, 0), half_at(b, 2));
    std::array::from_fn(|j| {
        let (sc, m) = scale_min_k4(j, scales);
        (d * sc as f32, dmin * m as f32)
    })
}

/// block_q4_K: d, dmin (f16), scales[12], qs[128]; 8 sub-blocks of 32:
/// value = d*sc * nibble - dmin*m; each 32 bytes of qs hold two sub-blocks (low, then high nibbles).
fn dequant_q4_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks::<144, 256>(src, dst) {
        let scales: &[u8; 12] = b[4..16].try_into().expect("12 bytes");
        let sm = k4_scales(b, scales);
        let qs = &b[16..144];
        for (i, (q, y)) in qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
            let (d1, m1) = sm[2 * i];
            let (d2, m2) = sm[2 * i + 1];
            let (lo, hi) = y.split_at_mut(32);
            for l in 0..32 {
                lo[l] = d1 * (q[l] & 0x0F) as f32 - m1;
                hi[l] = d2 * (q[l] >> 4) as f32 - m2;
            }
        }
    }
}

/// block_q5_K: d, dmin (f16), scales[12], qh[32], qs[128]; like Q4_K with a 5th bit from qh
/// (bit 2i of qh[l] for the low-nibble sub-block of group i, bit 2i+1 for the high one).
fn dequant_q5_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks::<176, 256>(src, dst) {
        let scales: &[u8; 12] = b[4..16].try_into().expect("12 bytes");
        let sm = k4_scales(b, scales);
        let qh = &b[16..48];
        let qs = &b[48..176];
        for (i, (q, y)) in qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
            let (d1, m1) = sm[2 * i];
            let (d2, m2) = sm[2 * i + 1];
            let (u1, u2) = (1u8 << (2 * i), 2u8 << (2 * i));
            let (lo, hi) = y.split_at_mut(32);
            for l in 0..32 {
                let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
                let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
                lo[l] = d1 * ((q[l] & 0x0F) + h1) as f32 - m1;
                hi[l] = d2 * ((q[l] >> 4) + h2) as f32 - m2;
            }
        }
    }
}

/// block_q6_K: ql[128], qh[64], scales[16] (i8), d (f16); value = d*scale * (q6 - 32).
/// Each half (128 values) uses 64 bytes of ql, 32 of qh and 8 scales.
fn dequant_q6_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in blocks::<210, 256>(src, dst) {
        let d = half_at(b, 208);
        let ds: [f32; 16] = std::array::from_fn(|k| d * (b[192 + k] as i8) as f32);
        for half in 0..2 {
            let ql = &b[64 * half..64 * half + 64];
            let qh = &b[128 + 32 * half..128 + 32 * half + 32];
            let sc = &ds[8 * half..8 * half + 8];
            let y = &mut y[128 * half..128 * half + 128];
            for l in 0..32 {
                let is = l / 16;
                let q1 = ((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) as i32 - 32;
                let q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                y[l] = sc[is] * q1 as f32;
                y[l + 32] = sc[is + 2] * q2 as f32;
                y[l + 64] = sc[is + 4] * q3 as f32;
                y[l + 96] = sc[is + 6] * q4 as f32;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f16_bytes(x: f32) -> [u8; 2] {
        f16::from_f32(x).to_bits().to_le_bytes()
    }

    fn run(ty: GgmlType, data: &[u8]) -> Vec<f32> {
        let n = data.len() / ty.type_size() * ty.block_size();
        let mut out = vec![f32::NAN; n];
        dequantize(ty, data, n, &mut out).expect("dequantize");
        out
    }

    #[test]
    fn q8_0_block_is_quants_times_scale() {
        let mut block = f16_bytes(0.5).to_vec();
        block.extend((0..32).map(|i| (i as i8 - 3) as u8)); // qs = -3, -2, ..., 28
        let out = run(GgmlType::Q8_0, &block);
        let expected: Vec<f32> = (0..32).map(|i| (i - 3) as f32 * 0.5).collect();
        assert_eq!(out, expected);
    }

    #[test]
    fn q4_0_block_puts_low_nibbles_first() {
        let mut block = f16_bytes(2.0).to_vec();
        block.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let out = run(GgmlType::Q4_0, &block);
        for j in 0..16 {
            assert_eq!(out[j], (j as f32 - 8.0) * 2.0, "low nibble {j}");
            assert_eq!(out[j + 16], (7.0 - j as f32) * 2.0, "high nibble {j}");
        }
    }

    #[test]
    fn q5_0_block_takes_fifth_bit_from_qh() {
        // All nibbles 0; qh sets the 5th bit of values 0 and 17 only: those are 16-16=0,
        // the rest 0-16=-16, times d=0.25.
        let mut block = f16_bytes(0.25).to_vec();
        block.extend((1u32 | (1 << 17)).to_le_bytes());
        block.extend([0u8; 16]);
        let out = run(GgmlType::Q5_0, &block);
        for (i, v) in out.iter().enumerate() {
            let expected = if i == 0 || i == 17 { 0.0 } else { -4.0 };
            assert_eq!(*v, expected, "value {i}");
        }
    }

    /// A Q4_K block whose scales are worked out by hand from the 12-byte packing.
    #[test]
    fn q4_k_block_with_hand_packed_scales() {
        // Sub-blocks 0..4: scale = low 6 bits of bytes 0..4, min = low 6 bits of bytes 4..8.
        // Sub-blocks 4..8: scale = low nibble of bytes 8..12 | (top 2 bits of bytes 0..4) << 4,
        //                  min   = high nibble of bytes 8..12 | (top 2 bits of bytes 4..8) << 4.
        let scales: [u8; 12] = [
            1 | (1 << 6), // sc0 = 1, sc4 high bits = 1
            2,
            3,
            63,           // sc3 = 63
            0,            // m0 = 0
            1,            // m1 = 1
            2 | (3 << 6), // m2 = 2, m6 high bits = 3
            5,
            0x02,             // sc4 = 2 | 1<<4 = 18, m4 = 0 | 0<<4 = 0
            0x70,             // sc5 = 0, m5 = 7
            0x4 | (0x1 << 4), // sc6 = 4, m6 = 1 | 3<<4 = 49
            0xF | (0xF << 4), // sc7 = 15, m7 = 15
        ];
        let sc = [1u8, 2, 3, 63, 18, 0, 4, 15];
        let m = [0u8, 1, 2, 5, 0, 7, 49, 15];
        for j in 0..8 {
            assert_eq!(scale_min_k4(j, &scales), (sc[j], m[j]), "sub-block {j}");
        }
        let (d, dmin) = (0.5f32, 0.25f32);
        let mut block = Vec::new();
        block.extend(f16_bytes(d));
        block.extend(f16_bytes(dmin));
        block.extend(scales);
        // qs byte l of group g: low nibble = l % 16, high nibble = 15 - l % 16.
        block.extend((0..128).map(|i| {
            let l = (i % 32) as u8 % 16;
            l | ((15 - l) << 4)
        }));
        let out = run(GgmlType::Q4_K, &block);
        for (i, v) in out.iter().enumerate() {
            let sub = i / 32;
            let l = (i % 32) as u8 % 16;
            let q = if sub % 2 == 0 { l } else { 15 - l };
            let expected = d * sc[sub] as f32 * q as f32 - dmin * m[sub] as f32;
            assert_eq!(*v, expected, "value {i}");
        }
        assert_eq!(out[0], 0.0);
        assert_eq!(out[32 + 1], 0.5 * 2.0 * 14.0 - 0.25);
    }

    #[test]
    fn q6_k_block_of_constant_quant_is_zero_times_scale() {
        // q6 = 32 everywhere (ql nibbles 0, qh pairs 0b10) decodes to 0 regardless of scale.
        let mut block = vec![0u8; 128];
        block.extend([0b1010_1010u8; 64]);
        block.extend([7u8; 16]);
        block.extend(f16_bytes(3.0));
        assert!(run(GgmlType::Q6_K, &block).iter().all(|v| *v == 0.0));
        // q6 = 0 everywhere: value = d * scale * -32 with scale -2 => 3 * -2 * -32 = 192.
        let mut block = vec![0u8; 192];
        block.extend([(-2i8) as u8; 16]);
        block.extend(f16_bytes(3.0));
        assert!(run(GgmlType::Q6_K, &block).iter().all(|v| *v == 192.0));
    }

    #[test]
    fn wrong_sizes_are_errors_not_panics() {
        let mut out = vec![0.0; 64];
        assert_eq!(
            dequantize(GgmlType::Q8_0, &[0; 34], 16, &mut out[..16]),
            Err(DequantError::PartialBlock {
                ty: GgmlType::Q8_0,
                n_elements: 16,
                block_size: 32
            })
        );
        assert!(matches!(
            dequantize(GgmlType::Q8_0, &[0; 33], 32, &mut out[..32]),
            Err(DequantError::DataSize {
                expected: 34,
                found: 33,
                ..
            })
        ));
        assert!(matches!(
            dequantize(GgmlType::Q8_0, &[0; 34], 32, &mut out),
            Err(DequantError::OutputSize {
                expected: 32,
                found: 64
            })
        ));
        assert_eq!(
            dequantize(GgmlType::Q2_K, &[0; 84], 256, &mut vec![0.0; 256]),
            Err(DequantError::Unsupported(GgmlType::Q2_K))
        );
        assert!(!supports(GgmlType::IQ4_XS) && supports(GgmlType::Q6_K));
    }

    #[test]
    fn threaded_and_single_threaded_results_are_identical() {
        // 2^20 + 3 blocks' worth of pseudo-random Q4_K data with finite scales.
        let n_blocks = (PARALLEL_MIN_ELEMENTS * 2) / 256 + 3;
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut data: Vec<u8> = (0..n_blocks * 144)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect();
        for b in data.chunks_exact_mut(144) {
            b[0..2].copy_from_slice(&f16_bytes(0.01));
            b[2..4].copy_from_slice(&f16_bytes(0.002));
        }
        let n = n_blocks * 256;
        let mut one = vec![0.0; n];
        let mut many = vec![0.0; n];
        dequantize_with_threads(GgmlType::Q4_K, &data, n, &mut one, 1).unwrap();
        dequantize_with_threads(GgmlType::Q4_K, &data, n, &mut many, 3).unwrap();
        assert!(one.iter().zip(&many).all(|(a, b)| a.to_bits() == b.to_bits()));
    }

    fn hex(s: &str) -> Vec<u8> {
        assert!(s.len() % 2 == 0);
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
            .collect()
    }

    /// Blocks of the real 0.5B model and random blocks, decoded by gguf-py
    /// (scripts/gen_dequant_fixture.py): every value must be bit-identical.
    #[test]
    fn matches_gguf_py_on_fixture_blocks() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/data/dequant_blocks.json"
        );
        let text = std::fs::read_to_string(path).expect("read tests/data/dequant_blocks.json");
        let doc: serde_json::Value = serde_json::from_str(&text).expect("parse fixture");
        let entries = doc["blocks"].as_array().expect("blocks array");
        let mut seen = std::collections::BTreeSet::new();
        for e in entries {
            let id = e["type_id"].as_u64().expect("type_id") as u32;
            let ty = GgmlType::from_id(id).expect("known type");
            assert_eq!(ty.name(), e["type"].as_str().unwrap());
            let data = hex(e["data_hex"].as_str().unwrap());
            let expected: Vec<u32> = hex(e["expected_f32_hex"].as_str().unwrap())
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            let n = e["n_elements"].as_u64().unwrap() as usize;
            assert_eq!(expected.len(), n);
            let mut out = vec![0.0f32; n];
            dequantize(ty, &data, n, &mut out).unwrap();
            let origin = e["origin"].as_str().unwrap();
            for (i, (got, want)) in out.iter().zip(&expected).enumerate() {
                assert_eq!(
                    got.to_bits(),
                    *want,
                    "{ty} ({origin}) value {i}: got {got:e}, gguf-py {:e}",
                    f32::from_bits(*want)
                );
            }
            seen.insert(ty.name());
        }
        for name in SUPPORTED_NAMES.split(", ") {
            assert!(seen.contains(name), "fixture has no {name} blocks");
        }
    }
}

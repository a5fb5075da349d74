//! MLX ops called through mlx-c directly, where mlx-rs's general indexing adds ops of its own.
//!
//! `array.try_index_mut(...)` drops an update's leading singleton axes and reshapes it back
//! before MLX's `slice_update` (two `Reshape`s around every cache write: four views a layer
//! and a decode step). [`slice_update`] is that one primitive alone. The arguments are checked
//! here, so mlx-c is never handed a call that fails.

use mlx_rs::error::Exception;
use mlx_rs::{Array, Stream};

/// `src` with `update` written at `start` (one start per axis of `src`, stride 1): one
/// `SliceUpdate`, done in place when nothing else holds `src`'s buffer.
pub(crate) fn slice_update(src: &Array, update: &Array, start: &[i32]) -> Result<Array, Exception> {
    let (shape, upd) = (src.shape(), update.shape());
    let fits = start.len() == shape.len()
        && upd.len() == shape.len()
        && start
            .iter()
            .zip(upd)
            .zip(shape)
            .all(|((&s, &u), &n)| s >= 0 && s.checked_add(u).is_some_and(|end| end <= n));
    if !fits || src.dtype() != update.dtype() {
        return Err(Exception::custom(format!(
            "slice_update: {:?} {upd:?} at {start:?} does not fit in {:?} {shape:?}",
            update.dtype(),
            src.dtype()
        )));
    }
    let stop: Vec<i32> = start.iter().zip(upd).map(|(s, u)| s + u).collect();
    let strides = vec![1; start.len()];
    let stream = Stream::new();
    // SAFETY: every handle is valid for the call; `res` is a fresh handle that MLX fills and
    // `Array::from_ptr` takes over (freed on failure); the shapes were checked above.
    unsafe {
        let mut res = mlx_sys::mlx_array_new();
        let rc = mlx_sys::mlx_slice_update(
            &mut res,
            src.as_ptr(),
            update.as_ptr(),
            start.as_ptr(),
            start.len(),
            stop.as_ptr(),
            stop.len(),
            strides.as_ptr(),
            strides.len(),
            stream.as_ptr(),
        );
        if rc != 0 {
            mlx_sys::mlx_array_free(res);
            return Err(Exception::custom("mlx_slice_update failed"));
        }
        Ok(Array::from_ptr(res))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::graph_primitives;

    #[test]
    fn a_slice_update_is_one_primitive_and_writes_where_asked() {
        let buf = mlx_rs::ops::zeros::<f32>(&[1, 2, 4, 3]).unwrap();
        let upd = Array::from_slice(&[1f32, 2., 3., 4., 5., 6.], &[1, 2, 1, 3]);
        mlx_rs::transforms::eval([&buf, &upd]).unwrap();
        let out = slice_update(&buf, &upd, &[0, 0, 2, 0]).unwrap();
        let counts = graph_primitives(&[&out]).unwrap();
        assert_eq!(counts.values().sum::<usize>(), 1, "{counts:?}");
        assert_eq!(counts.get("SliceUpdate"), Some(&1), "{counts:?}");
        let got: Vec<f32> = out.as_slice::<f32>().to_vec();
        let mut want = vec![0f32; 24];
        want[6..9].copy_from_slice(&[1., 2., 3.]);
        want[18..21].copy_from_slice(&[4., 5., 6.]);
        assert_eq!(got, want);
    }

    #[test]
    fn an_update_that_does_not_fit_is_an_error_not_a_call() {
        let buf = mlx_rs::ops::zeros::<f32>(&[1, 2, 4, 3]).unwrap();
        let upd = mlx_rs::ops::zeros::<f32>(&[1, 2, 1, 3]).unwrap();
        for start in [&[0, 0, 4, 0][..], &[0, 0, -1, 0], &[0, 0, 0], &[0, 1, 0, 0]] {
            assert!(slice_update(&buf, &upd, start).is_err(), "{start:?}");
        }
        let half = mlx_rs::ops::zeros::<half::f16>(&[1, 2, 1, 3]).unwrap();
        assert!(slice_update(&buf, &half, &[0, 0, 0, 0]).is_err());
    }
}

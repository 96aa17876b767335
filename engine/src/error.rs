use thiserror::Error;

/// Every failure the engine reports. Messages are written for the person using the app.
#[derive(Debug, Error)]
pub enum DriftError {
    #[error("no GPU adapter found: {0}")]
    NoAdapter(String),
    #[error("could not open the GPU device: {0}")]
    Device(String),
    #[error("GPU out of memory while allocating {bytes} bytes for {what}")]
    OutOfMemory { what: String, bytes: u64 },
    #[error("GPU error: {0}")]
    Gpu(String),
    #[error("shape error: {0}")]
    Shape(String),
    #[error("unsupported: {0}")]
    Unsupported(String),
    #[error("shader {name} failed to compile: {message}")]
    Shader { name: String, message: String },
    #[error("{0}")]
    Other(String),
}

pub type Result<T> = std::result::Result<T, DriftError>;

/// Shorthand for shape errors with `format!` arguments.
#[macro_export]
macro_rules! shape_err {
    ($($arg:tt)*) => { $crate::error::DriftError::Shape(format!($($arg)*)) };
}

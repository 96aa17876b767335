//! A wgpu buffer that counts itself in the device's [`MemoryTracker`] for as long as it lives.

use std::sync::Arc;

use super::{Category, MemoryTracker};

#[derive(Debug)]
pub struct GpuBuffer {
    pub buffer: wgpu::Buffer,
    pub category: Category,
    size: u64,
    tracker: Arc<MemoryTracker>,
}

impl GpuBuffer {
    pub(crate) fn new(
        buffer: wgpu::Buffer,
        category: Category,
        tracker: Arc<MemoryTracker>,
    ) -> Self {
        let size = buffer.size();
        tracker.add(category, size);
        GpuBuffer {
            buffer,
            category,
            size,
            tracker,
        }
    }

    pub fn size(&self) -> u64 {
        self.size
    }
}

impl Drop for GpuBuffer {
    fn drop(&mut self) {
        self.tracker.remove(self.category, self.size);
    }
}

//! Stream framing: each frame follows its length as a 4-byte big-endian
//! integer (QEMU `-netdev stream`, passt, socket_vmnet). `Deframer` takes
//! bytes as they arrive, split anywhere, and yields whole frames in place,
//! without copying them out; its buffer is allocated once.

use std::ops::Range;

use thiserror::Error;

pub const LENGTH_BYTES: usize = 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum FramingError {
    #[error("a frame length of 0")]
    Empty,
    #[error("a frame length of {len} bytes, above the maximum of {max}")]
    TooLong { len: usize, max: usize },
}

pub fn length_prefix(len: usize) -> [u8; LENGTH_BYTES] {
    (len as u32).to_be_bytes()
}

pub struct Deframer {
    buf: Box<[u8]>,
    /// Unconsumed bytes are buf[start..end].
    start: usize,
    end: usize,
    max_frame: usize,
}

impl Deframer {
    /// `max_frame`: the largest frame accepted (without its length).
    /// `capacity`: the buffer, at least one largest frame with its length.
    pub fn new(max_frame: usize, capacity: usize) -> Deframer {
        let capacity = capacity.max(LENGTH_BYTES + max_frame);
        Deframer {
            buf: vec![0; capacity].into_boxed_slice(),
            start: 0,
            end: 0,
            max_frame,
        }
    }

    /// Where the next bytes from the socket go; never empty.
    pub fn spare(&mut self) -> &mut [u8] {
        if self.start == self.end {
            (self.start, self.end) = (0, 0);
        } else if self.buf.len() - self.end < LENGTH_BYTES + self.max_frame {
            // Too little room for another whole frame: move the partial one down.
            self.buf.copy_within(self.start..self.end, 0);
            (self.start, self.end) = (0, self.end - self.start);
        }
        &mut self.buf[self.end..]
    }

    /// `n` bytes were written into `spare()`.
    pub fn filled(&mut self, n: usize) {
        self.end += n;
    }

    /// The next whole frame's place in `buffer()`, consumed; `None` until
    /// one has fully arrived. After an error the stream cannot be trusted:
    /// call `reset` before using it again.
    pub fn next_frame(&mut self) -> Option<Result<Range<usize>, FramingError>> {
        let available = self.end - self.start;
        if available < LENGTH_BYTES {
            return None;
        }
        let mut prefix = [0u8; LENGTH_BYTES];
        prefix.copy_from_slice(&self.buf[self.start..self.start + LENGTH_BYTES]);
        let len = u32::from_be_bytes(prefix) as usize;
        if len == 0 {
            return Some(Err(FramingError::Empty));
        }
        if len > self.max_frame {
            return Some(Err(FramingError::TooLong {
                len,
                max: self.max_frame,
            }));
        }
        if available < LENGTH_BYTES + len {
            return None;
        }
        let frame = self.start + LENGTH_BYTES..self.start + LENGTH_BYTES + len;
        self.start = frame.end;
        Some(Ok(frame))
    }

    pub fn buffer(&self) -> &[u8] {
        &self.buf
    }

    /// Bytes of a frame that has begun to arrive but not finished.
    pub fn pending(&self) -> usize {
        self.end - self.start
    }

    /// Forgets everything (a new client).
    pub fn reset(&mut self) {
        (self.start, self.end) = (0, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire(frames: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for f in frames {
            out.extend_from_slice(&length_prefix(f.len()));
            out.extend_from_slice(f);
        }
        out
    }

    fn feed(d: &mut Deframer, mut bytes: &[u8], chunk: usize) -> Vec<Vec<u8>> {
        let mut frames = Vec::new();
        while !bytes.is_empty() {
            let spare = d.spare();
            let n = chunk.min(spare.len()).min(bytes.len());
            spare[..n].copy_from_slice(&bytes[..n]);
            d.filled(n);
            bytes = &bytes[n..];
            while let Some(frame) = d.next_frame() {
                frames.push(d.buffer()[frame.unwrap()].to_vec());
            }
        }
        frames
    }

    #[test]
    fn frames_split_anywhere_come_out_whole() {
        let a = vec![0xaa; 60];
        let b = vec![0xbb; 1514];
        let c = vec![0xcc; 14];
        let bytes = wire(&[&a, &b, &c, &b]);
        for chunk in [1, 3, 4, 5, 61, 1000, 4096] {
            // A small buffer forces the partial frame to move down often.
            let mut d = Deframer::new(1514, 1600);
            assert_eq!(
                feed(&mut d, &bytes, chunk),
                [&a, &b, &c, &b].map(|f| f.clone()),
                "chunk {chunk}"
            );
            assert_eq!(d.pending(), 0);
        }
    }

    #[test]
    fn a_partial_frame_waits() {
        let mut d = Deframer::new(100, 1000);
        let bytes = wire(&[&[1; 50]]);
        assert!(feed(&mut d, &bytes[..30], 30).is_empty());
        assert_eq!(d.pending(), 30);
        assert_eq!(feed(&mut d, &bytes[30..], 100), [vec![1; 50]]);
    }

    #[test]
    fn zero_and_oversized_lengths_are_errors() {
        let mut d = Deframer::new(1514, 4096);
        d.spare()[..4].copy_from_slice(&[0, 0, 0, 0]);
        d.filled(4);
        assert_eq!(d.next_frame(), Some(Err(FramingError::Empty)));
        d.reset();
        d.spare()[..4].copy_from_slice(&length_prefix(70000));
        d.filled(4);
        assert_eq!(
            d.next_frame(),
            Some(Err(FramingError::TooLong {
                len: 70000,
                max: 1514
            }))
        );
        d.reset();
        assert_eq!(d.pending(), 0);
        assert!(d.next_frame().is_none());
    }
}

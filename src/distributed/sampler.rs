//! `DistributedSampler`: each rank's share of a data set's indices for one epoch, as PyTorch's
//! `torch.utils.data.DistributedSampler`.
//!
//! Every rank computes the same order (a shuffle seeded by `seed + epoch`, or `0..len`), pads it by repeating its
//! first indices until it divides evenly by the world size (or, with `drop_last`, cuts the tail instead), and takes
//! every `world`-th index starting at its rank. So the ranks' shares are disjoint up to the padding, equally long
//! (every rank takes the same number of steps: a rank with one step more would wait at a collective the others
//! never reach), and together cover the data set once per epoch. The shuffle is SplitMix64-driven Fisher-Yates, so
//! the orders are kiln's own, not `torch.randperm`'s.

use super::ProcessGroup;

/// Which indices of a data set this rank visits in an epoch; see the module doc.
#[derive(Clone, Debug)]
pub struct DistributedSampler {
    len: usize,
    rank: usize,
    world: usize,
    shuffle: bool,
    seed: u64,
    drop_last: bool,
}

impl DistributedSampler {
    /// A sampler over `len` samples for this rank of `group`: shuffled with seed 0, padded (not dropped).
    pub fn new(len: usize, group: &ProcessGroup) -> DistributedSampler {
        DistributedSampler::for_rank(len, group.rank(), group.world_size())
    }

    /// The sampler of rank `rank` in a world of `world` (what `new` does with a group's rank and size).
    ///
    /// # Panics
    /// If `rank >= world`.
    #[track_caller]
    pub fn for_rank(len: usize, rank: usize, world: usize) -> DistributedSampler {
        assert!(rank < world, "DistributedSampler: rank {rank} is not below the world size {world}");
        DistributedSampler { len, rank, world, shuffle: true, seed: 0, drop_last: false }
    }

    /// Whether each epoch visits the samples in a new random order (default true).
    pub fn shuffle(mut self, shuffle: bool) -> DistributedSampler {
        self.shuffle = shuffle;
        self
    }

    /// The shuffle's seed (every rank must use the same one).
    pub fn seed(mut self, seed: u64) -> DistributedSampler {
        self.seed = seed;
        self
    }

    /// Cut the tail that does not divide evenly instead of padding with repeated samples.
    pub fn drop_last(mut self, drop_last: bool) -> DistributedSampler {
        self.drop_last = drop_last;
        self
    }

    /// How many indices each rank gets per epoch.
    pub fn num_samples(&self) -> usize {
        if self.drop_last { self.len / self.world } else { self.len.div_ceil(self.world) }
    }

    /// This rank's indices for `epoch`, in visiting order.
    pub fn indices(&self, epoch: u64) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.len).collect();
        if self.shuffle {
            let mut rng = SplitMix64(self.seed.wrapping_add(epoch));
            for i in (1..order.len()).rev() {
                order.swap(i, rng.below(i + 1));
            }
        }
        let total = self.num_samples() * self.world;
        if total > order.len() && !order.is_empty() {
            // Repeat from the start (more than once if the data set is smaller than the world).
            let pad: Vec<usize> = order.iter().copied().cycle().take(total - order.len()).collect();
            order.extend(pad);
        }
        order.truncate(total);
        order.into_iter().skip(self.rank).step_by(self.world).collect()
    }
}

/// SplitMix64 (Steele, Lea & Flood 2014).
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`), by Lemire's multiply-shift.
    fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_cover_the_data_once_and_have_equal_lengths() {
        for (len, world) in [(10, 3), (9, 3), (2, 4), (1437, 2), (0, 2)] {
            for drop_last in [false, true] {
                let shares: Vec<Vec<usize>> = (0..world)
                    .map(|r| DistributedSampler::for_rank(len, r, world).seed(5).drop_last(drop_last).indices(3))
                    .collect();
                let n = shares[0].len();
                assert!(shares.iter().all(|s| s.len() == n), "{len}/{world}: unequal shares");
                let mut all: Vec<usize> = shares.concat();
                all.sort_unstable();
                let distinct = {
                    let mut d = all.clone();
                    d.dedup();
                    d
                };
                if drop_last {
                    assert_eq!(all.len(), len / world * world);
                    assert_eq!(distinct.len(), all.len(), "dropping the tail repeats nothing");
                } else {
                    assert_eq!(all.len(), len.div_ceil(world) * world);
                    assert_eq!(distinct, (0..len).collect::<Vec<_>>(), "{len}/{world}: every sample visited");
                }
            }
        }
    }

    #[test]
    fn epochs_reorder_and_seeds_agree() {
        let a = DistributedSampler::for_rank(100, 1, 2).seed(9);
        assert_eq!(a.indices(0), a.clone().indices(0), "deterministic");
        assert_ne!(a.indices(0), a.indices(1), "a new order each epoch");
        let plain = DistributedSampler::for_rank(7, 1, 2).shuffle(false);
        assert_eq!(plain.indices(0), vec![1, 3, 5, 0], "PyTorch's padding: the first index repeats");
    }
}

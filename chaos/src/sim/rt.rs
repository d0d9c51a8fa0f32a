//! openraft's async runtime for the simulation: tokio (a current-thread runtime with paused,
//! auto-advancing time, so timers are virtual and the order of tasks fixed) with the one
//! source of randomness openraft uses — election timeouts — drawn from the run's seed instead
//! of the thread's entropy.

use std::cell::RefCell;
use std::future::Future;
use std::time::Duration;

use openraft::{AsyncRuntime, OptionalSend, TokioInstant};
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

thread_local! {
    static RNG: RefCell<ChaCha8Rng> = RefCell::new(ChaCha8Rng::seed_from_u64(0));
}

/// Seeds this thread's generator (each simulation runs on one thread).
pub fn seed(seed: u64) {
    RNG.with(|r| *r.borrow_mut() = ChaCha8Rng::seed_from_u64(seed));
}

/// A draw from the run's seeded stream.
pub fn next_u64() -> u64 {
    RNG.with(|r| r.borrow_mut().next_u64())
}

/// Hands openraft the seeded stream (rand 0.8's traits, which openraft 0.9 uses).
#[derive(Debug, Default, Clone, Copy)]
pub struct SeededRng;

impl rand08::RngCore for SeededRng {
    fn next_u32(&mut self) -> u32 {
        next_u64() as u32
    }

    fn next_u64(&mut self) -> u64 {
        next_u64()
    }

    fn fill_bytes(&mut self, dest: &mut [u8]) {
        for chunk in dest.chunks_mut(8) {
            let bytes = next_u64().to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
    }

    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand08::Error> {
        self.fill_bytes(dest);
        Ok(())
    }
}

/// tokio, with seeded election timeouts.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SimRuntime;

impl AsyncRuntime for SimRuntime {
    type JoinError = tokio::task::JoinError;
    type JoinHandle<T: OptionalSend + 'static> = tokio::task::JoinHandle<T>;
    type Sleep = tokio::time::Sleep;
    type Instant = TokioInstant;
    type TimeoutError = tokio::time::error::Elapsed;
    type Timeout<R, T: Future<Output = R> + OptionalSend> = tokio::time::Timeout<T>;
    type ThreadLocalRng = SeededRng;
    type OneshotSender<T: OptionalSend> = openraft::async_runtime::TokioOneShotSender<T>;
    type OneshotReceiver<T: OptionalSend> = tokio::sync::oneshot::Receiver<T>;
    type OneshotReceiverError = tokio::sync::oneshot::error::RecvError;

    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: Future + OptionalSend + 'static,
        T::Output: OptionalSend + 'static,
    {
        tokio::task::spawn(future)
    }

    fn sleep(duration: Duration) -> Self::Sleep {
        tokio::time::sleep(duration)
    }

    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        tokio::time::sleep_until(deadline)
    }

    fn timeout<R, F: Future<Output = R> + OptionalSend>(
        duration: Duration,
        future: F,
    ) -> Self::Timeout<R, F> {
        tokio::time::timeout(duration, future)
    }

    fn timeout_at<R, F: Future<Output = R> + OptionalSend>(
        deadline: Self::Instant,
        future: F,
    ) -> Self::Timeout<R, F> {
        tokio::time::timeout_at(deadline, future)
    }

    fn is_panic(join_error: &Self::JoinError) -> bool {
        join_error.is_panic()
    }

    fn thread_rng() -> Self::ThreadLocalRng {
        SeededRng
    }

    fn oneshot<T>() -> (Self::OneshotSender<T>, Self::OneshotReceiver<T>)
    where
        T: OptionalSend,
    {
        let (tx, rx) = tokio::sync::oneshot::channel();
        (openraft::async_runtime::TokioOneShotSender(tx), rx)
    }
}

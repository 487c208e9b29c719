//! The methods the `background-worker` serves: a handler that leaves a task of its own running
//! on the worker's serving runtime after its call is answered, and a look at whether that task
//! has finished. The idle-wait tests (`tests/idle_wait.rs`) use them.

airlock_host::method!(
    /// Spawns a task on the worker's runtime that sleeps this many milliseconds, then records
    /// that it finished; answers at once.
    pub StartBackground, "start_background", u64 => ()
);
airlock_host::method!(
    /// Whether the task `start_background` spawned last has finished.
    pub BackgroundDone, "background_done", () => bool
);

//! Model 3: fleet hand-off.

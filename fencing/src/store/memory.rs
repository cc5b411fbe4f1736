use std::collections::HashMap;
use std::sync::Mutex;

use futures::future::BoxFuture;

use super::{HighWaterMarks, StoreError};
use crate::Token;

/// Marks in memory only. For tests: a restart forgets every mark, which is exactly the failure
/// the durable stores exist to prevent.
#[derive(Debug, Default)]
pub struct MemoryStore {
    marks: Mutex<HashMap<String, Token>>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }
}

impl HighWaterMarks for MemoryStore {
    fn get<'a>(&'a self, resource: &'a str) -> BoxFuture<'a, Result<Option<Token>, StoreError>> {
        Box::pin(async move {
            let marks = self
                .marks
                .lock()
                .map_err(|_| StoreError("poisoned".into()))?;
            Ok(marks.get(resource).copied())
        })
    }

    fn raise<'a>(
        &'a self,
        resource: &'a str,
        token: Token,
    ) -> BoxFuture<'a, Result<Token, StoreError>> {
        Box::pin(async move {
            let mut marks = self
                .marks
                .lock()
                .map_err(|_| StoreError("poisoned".into()))?;
            let mark = marks.entry(resource.to_owned()).or_insert(token);
            *mark = (*mark).max(token);
            Ok(*mark)
        })
    }

    /// Memory takes every write it can lock.
    fn probe(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            self.marks
                .lock()
                .map(drop)
                .map_err(|_| StoreError("poisoned".into()))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn marks_only_rise() {
        crate::store::assert_marks_only_rise(&MemoryStore::new()).await;
    }
}

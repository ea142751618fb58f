//! A room's players by id, without a second copy of each id: the table
//! holds slot numbers and hashes the ids where the players keep them. A
//! room holds an entry per player for its life, so a copy of the id (a
//! `String` and its heap bytes) was 40 bytes of every idle player.

use foldhash::fast::RandomState;
use hashbrown::HashTable;
use std::hash::BuildHasher;

/// Slots of a list of items that each have an id (`id_of`), found by id.
#[derive(Clone, Default)]
pub(super) struct ById {
    table: HashTable<usize>,
    hasher: RandomState,
}

impl ById {
    /// The slot of the item with id `id`.
    pub(super) fn get<T>(
        &self,
        items: &[T],
        id_of: impl Fn(&T) -> &str,
        id: &str,
    ) -> Option<usize> {
        let h = self.hasher.hash_one(id);
        self.table
            .find(h, |&i| items.get(i).is_some_and(|t| id_of(t) == id))
            .copied()
    }

    /// Indexes slot `index` of `items` (its id not indexed yet).
    pub(super) fn insert<T>(&mut self, items: &[T], id_of: impl Fn(&T) -> &str, index: usize) {
        let Some(item) = items.get(index) else {
            return;
        };
        let hasher = &self.hasher;
        let h = hasher.hash_one(id_of(item));
        self.table.insert_unique(h, index, |&i| {
            items.get(i).map_or(0, |t| hasher.hash_one(id_of(t)))
        });
    }

    /// Forgets slot `index`, whose item is still in `items` (it is about to
    /// be removed from them), and moves the later slots down by one.
    pub(super) fn remove<T>(&mut self, items: &[T], id_of: impl Fn(&T) -> &str, index: usize) {
        let Some(item) = items.get(index) else {
            return;
        };
        let h = self.hasher.hash_one(id_of(item));
        if let Ok(e) = self.table.find_entry(h, |&i| i == index) {
            e.remove();
        }
        for i in self.table.iter_mut() {
            if *i > index {
                *i -= 1;
            }
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.table.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &String) -> &str {
        s
    }

    /// Found by id after inserts and removals, the later slots moved down
    /// as the list's are.
    #[test]
    fn slots_follow_the_list() {
        let mut items: Vec<String> = (0..100).map(|i| format!("p-{i}")).collect();
        let mut by = ById::default();
        for i in 0..items.len() {
            by.insert(&items, id, i);
        }
        for i in [0, 50, 97, 10] {
            by.remove(&items, id, i);
            items.remove(i);
        }
        assert_eq!(by.len(), items.len());
        for (i, s) in items.iter().enumerate() {
            assert_eq!(by.get(&items, id, s), Some(i), "{s}");
        }
        for gone in ["p-0", "p-51", "p-99", "p-11", "nobody"] {
            assert_eq!(by.get(&items, id, gone), None, "{gone}");
        }
    }
}

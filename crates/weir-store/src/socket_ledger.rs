//! The socket ledger's rows in an actor's database (`_weir_sockets`): one
//! per socket of the actor that was accepted and whose end the actor has
//! not yet been told of. This module only keeps them; when they are
//! written and what a node does with the rows it finds is
//! `weir_http::websocket::actor`'s.
//!
//! Invariants owned here: a socket's id is unique among the actor's
//! sockets for the life of its database, across processes and nodes (the
//! next id is kept in the database itself, `_weir_meta`'s `socket-seq`,
//! never below an id still listed); an id is listed from the commit of
//! the turn that accepted its socket until the commit of the turn that
//! told the actor of its end.

use crate::actor::{ActorDb, ActorStoreError};

impl ActorDb {
    /// Lists a new socket in the turn, and returns its id: one more than
    /// any id the actor's sockets had.
    pub fn socket_opened(&mut self) -> Result<u64, ActorStoreError> {
        let id: i64 = self
            .conn
            .prepare_cached(
                "INSERT INTO _weir_meta (name, value)
                 VALUES ('socket-seq', 1 + (SELECT coalesce(max(id), 0) FROM _weir_sockets))
                 ON CONFLICT (name) DO UPDATE SET value = max(value,
                     (SELECT coalesce(max(id), 0) FROM _weir_sockets)) + 1
                 RETURNING value",
            )?
            .query_row([], |r| r.get(0))?;
        self.conn
            .prepare_cached("INSERT INTO _weir_sockets (id) VALUES (?1)")?
            .execute([id])?;
        Ok(id as u64)
    }

    /// Takes socket `id` off the list: the actor was told of its end (or
    /// the socket never was the actor's). True if it was listed.
    pub fn socket_ended(&mut self, id: u64) -> Result<bool, ActorStoreError> {
        Ok(self
            .conn
            .prepare_cached("DELETE FROM _weir_sockets WHERE id = ?1")?
            .execute([id as i64])?
            > 0)
    }

    /// The ids of the actor's listed sockets, in order.
    pub fn sockets_listed(&self) -> Result<Vec<u64>, ActorStoreError> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT id FROM _weir_sockets ORDER BY id")?;
        let ids = stmt
            .query_map([], |r| r.get::<_, i64>(0))?
            .map(|id| id.map(|id| id as u64))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ids)
    }
}

#[cfg(test)]
mod tests {
    use crate::Durability;
    use crate::actor::ActorDb;
    use crate::actor::tests::open;

    #[test]
    fn ids_never_repeat_in_one_database_whatever_was_taken_off_the_list() {
        let (mut db, path) = open("socket-ledger");
        assert_eq!(db.socket_opened().unwrap(), 1);
        assert_eq!(db.socket_opened().unwrap(), 2);
        assert!(db.socket_ended(2).unwrap());
        assert!(!db.socket_ended(2).unwrap());
        // The highest id ended: the next is still new.
        assert_eq!(db.socket_opened().unwrap(), 3);
        assert_eq!(db.sockets_listed().unwrap(), [1, 3]);
        drop(db);
        // Another process, the same sequence.
        let mut db = ActorDb::open(&path, Durability::Process).unwrap();
        assert_eq!(db.socket_opened().unwrap(), 4);
        assert_eq!(db.sockets_listed().unwrap(), [1, 3, 4]);
    }
}

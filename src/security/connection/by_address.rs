//! Connections and TLS handshakes counted per peer address, so that one peer cannot take every
//! slot its listener has for all of them.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, Mutex, PoisonError};

/// Where a peer connects from, as the per-address caps count it, or `None` for this host's own
/// loopback address (`127.0.0.1`, `::1`): the address a pod's exec probes and sidecars connect
/// from, which no peer elsewhere can take.
///
/// An IPv6 peer counts by its /64, one subscriber's usual allocation: its low bits are free for
/// it to change.
pub(crate) fn source(peer: IpAddr) -> Option<IpAddr> {
    match peer.to_canonical() {
        IpAddr::V4(v4) if v4 == Ipv4Addr::LOCALHOST => None,
        IpAddr::V6(v6) if v6 == Ipv6Addr::LOCALHOST => None,
        IpAddr::V4(v4) => Some(IpAddr::V4(v4)),
        IpAddr::V6(v6) => Some(IpAddr::V6(Ipv6Addr::from_bits(v6.to_bits() & !u128::from(u64::MAX)))),
    }
}

/// What a slot counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// An open connection.
    Connection,
    /// A TLS handshake under way (from the connection's accept to the handshake's end).
    Handshake,
}

#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    connections: u32,
    handshakes: u32,
}

impl Counts {
    fn of(&mut self, kind: Kind) -> &mut u32 {
        match kind {
            Kind::Connection => &mut self.connections,
            Kind::Handshake => &mut self.handshakes,
        }
    }
}

/// The counts of one listener, each address's entry gone once it holds nothing.
#[derive(Debug)]
pub(crate) struct ByAddress {
    counts: Mutex<HashMap<IpAddr, Counts>>,
    max_connections: u32,
    max_handshakes: u32,
}

impl ByAddress {
    pub(crate) fn new(max_connections: u32, max_handshakes: u32) -> Arc<Self> {
        Arc::new(Self { counts: Mutex::default(), max_connections, max_handshakes })
    }

    /// A slot of `kind` for `address`, unless the address holds its cap of them already.
    pub(crate) fn take(self: &Arc<Self>, address: IpAddr, kind: Kind) -> Option<AddressSlot> {
        let cap = match kind {
            Kind::Connection => self.max_connections,
            Kind::Handshake => self.max_handshakes,
        };
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        let held = counts.entry(address).or_default().of(kind);
        if *held >= cap {
            return None;
        }
        *held += 1;
        Some(AddressSlot { table: Arc::clone(self), address, kind })
    }
}

/// One connection or handshake of an address, given back when dropped.
#[derive(Debug)]
pub(crate) struct AddressSlot {
    table: Arc<ByAddress>,
    address: IpAddr,
    kind: Kind,
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        let mut counts = self.table.counts.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(entry) = counts.get_mut(&self.address) {
            let held = entry.of(self.kind);
            *held = held.saturating_sub(1);
            if entry.connections == 0 && entry.handshakes == 0 {
                counts.remove(&self.address);
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn this_hosts_loopback_is_exempt_and_an_ipv6_peer_counts_by_its_64() {
        assert_eq!(source("127.0.0.1".parse().unwrap()), None);
        assert_eq!(source("::ffff:127.0.0.1".parse().unwrap()), None);
        assert_eq!(source("::1".parse().unwrap()), None);
        assert_eq!(source("127.0.0.2".parse().unwrap()), Some("127.0.0.2".parse().unwrap()));
        assert_eq!(source("2001:db8:1:2:3:4:5:6".parse().unwrap()), Some("2001:db8:1:2::".parse().unwrap()));
    }

    #[test]
    fn an_address_at_its_cap_gets_no_slot_until_one_is_given_back() {
        let table = ByAddress::new(2, 1);
        let (a, b) = ("192.0.2.1".parse().unwrap(), "192.0.2.2".parse().unwrap());
        let first = table.take(a, Kind::Connection).unwrap();
        let _second = table.take(a, Kind::Connection).unwrap();
        assert!(table.take(a, Kind::Connection).is_none(), "a third connection of one address");
        assert!(table.take(b, Kind::Connection).is_some(), "another address is not counted with it");
        let _handshake = table.take(a, Kind::Handshake).unwrap();
        assert!(table.take(a, Kind::Handshake).is_none());
        drop(first);
        assert!(table.take(a, Kind::Connection).is_some(), "a slot given back is free again");
    }
}

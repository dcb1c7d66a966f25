import CJSONC
import PylonCore
import PylonProtocol

/// Publications: one notification line to every subscriber of its topic, found in the
/// subscription index (`SubscriptionIndex`), within the slow-reader and per-uid queue bounds.
extension Bus {
    /// Delivers one notification line, as it is, to every subscriber of `topic` but the sender.
    @discardableResult
    func publish(topic: String, line: UnsafeRawBufferPointer, from sender: Peer?) -> Int {
        counters.published += 1
        var delivered = 0
        let adminOnly = isAdminTopic(topic)
        // What each uid has queued, summed when first needed and kept up to date as this
        // publication is queued (one pass over that uid's connections per publication).
        var uidQueued: [UInt32: Int] = [:]
        for id in peerTable.subscriptions.subscribers(of: topic) {
            guard let peer = peerTable.peers[id], peer !== sender, !peer.closed else { continue }
            if peer.isPlugin {
                guard peer.handshaken else { continue }
            } else if adminOnly && !isAdmin(peer) {
                continue
            }
            if peer.conn.queuedBytes > config.limits.maxQueuedBytes {
                peer.droppedNotifications += 1
                continue
            }
            if let uid = peer.credentials?.uid {
                let queued = uidQueued[uid] ?? queuedBytes(ofUid: uid)
                guard queued + line.count <= config.limits.maxQueuedBytesPerUid else {
                    uidQueued[uid] = queued
                    peer.droppedNotifications += 1
                    counters.droppedForUidQueue += 1
                    continue
                }
                uidQueued[uid] = queued + line.count + 1
            }
            peer.conn.sendLine(line)
            delivered += 1
        }
        if !monitoring.monitors.isEmpty { monitorPublication(topic, line, from: sender, delivered: delivered) }
        return delivered
    }

    /// Bytes held for all client connections of `uid`: queued, and in open batches.
    func queuedBytes(ofUid uid: UInt32) -> Int {
        peerTable.admission.members(ofUid: uid).reduce(0) { $0 + $1.heldBytes }
    }

    func publish(topic: String, params: JSON, from sender: Peer? = nil) {
        Envelope.notification(method: topic, params: .value(params)).withUnsafeBytes {
            _ = publish(topic: topic, line: $0, from: sender)
        }
    }
}

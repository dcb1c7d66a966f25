import PylonPluginKit

/// What each owner holds in the queue, and whether it may add more: the disk cap shared fairly.
/// A pure value; the uploader tells it every change of the queue.
struct OwnerLedger {
    /// One owner's share in use.
    struct Usage: Equatable {
        /// Bytes of record bodies on disk (queued or in a batch).
        var bytes = 0
        /// Bytes accepted and waiting for the next group commit.
        var pending = 0
        /// Streams registered to the owner.
        var streams = 0
    }

    /// Per owner, in one table: an enqueue looks its owner up once, not once per counter.
    private(set) var owners: [StreamOwner: Usage] = [:]

    func usage(_ o: StreamOwner) -> (bytes: Int, streams: Int) {
        let u = owners[o] ?? Usage()
        return (u.bytes + u.pending, u.streams)
    }

    /// nil when `owner` may queue `n` more bytes (on a new stream if `newStream`); otherwise the
    /// -32004 error naming the limit. `totalBytes` is what every owner holds (the shared cap).
    func admit(_ owner: StreamOwner, bytes n: Int, newStream: Bool, totalBytes: Int, limits: UploaderLimits) -> RPCError? {
        let u = owners[owner] ?? Usage()
        if newStream, u.streams >= limits.streams(for: owner) {
            let max = limits.streams(for: owner)
            return RPCError(
                .overloaded, "\(owner) already has \(max) streams (maxStreamsPerOwner); new stream refused",
                data: ["limit": "maxStreamsPerOwner", "value": .int(Int64(max)), "owner": .string(owner.description)])
        }
        if totalBytes + n > limits.maxDiskBytes {
            return RPCError(
                .overloaded, "uploader queue is full (\(limits.maxDiskBytes) bytes on disk, maxDiskBytes); records refused",
                data: ["limit": "maxDiskBytes", "value": .int(Int64(limits.maxDiskBytes))])
        }
        let quota = limits.diskBytes(for: owner)
        let held = u.bytes + u.pending
        if held + n > quota {
            return RPCError(
                .overloaded, "\(owner) has \(held) of its \(quota) bytes queued (maxDiskBytesPerOwner); records refused",
                data: ["limit": "maxDiskBytesPerOwner", "value": .int(Int64(quota)), "owner": .string(owner.description)])
        }
        return nil
    }

    mutating func addStream(_ o: StreamOwner) { update(o) { $0.streams += 1 } }
    mutating func reserve(_ o: StreamOwner, _ n: Int) { update(o) { $0.pending += n } }
    /// A group commit finished: `reserved` bytes were waiting, `stored` of them were new rows.
    mutating func committed(_ o: StreamOwner, reserved: Int, stored: Int) {
        update(o) {
            $0.pending = max(0, $0.pending - reserved)
            $0.bytes += stored
        }
    }
    mutating func add(_ o: StreamOwner, _ n: Int) { update(o) { $0.bytes += n } }
    mutating func remove(_ o: StreamOwner, _ n: Int) { update(o) { $0.bytes = max(0, $0.bytes - n) } }

    /// A stream holding `bytes` (records and dead letters on disk) changed hands
    /// (`uploader.setOwner`): it and its bytes leave `from` and count for `to` (nil: nobody, a
    /// released stream). Its bytes still waiting for a group commit are committed first.
    mutating func handOver(from: StreamOwner?, to: StreamOwner?, bytes: Int) {
        if let from {
            update(from) {
                $0.streams = max(0, $0.streams - 1)
                $0.bytes = max(0, $0.bytes - bytes)
            }
        }
        if let to {
            update(to) {
                $0.streams += 1
                $0.bytes += bytes
            }
        }
    }

    /// One lookup of `o`'s entry (made when missing), changed in place.
    private mutating func update(_ o: StreamOwner, _ change: (inout Usage) -> Void) { change(&owners[o, default: Usage()]) }
}

import PylonPluginKit

/// What each owner holds in the queue, and whether it may add more: the disk cap shared fairly.
/// A pure value; the uploader tells it every change of the queue.
struct OwnerLedger {
    /// Bytes of record bodies on disk (queued or in a batch), per owner.
    private(set) var bytes: [StreamOwner: Int] = [:]
    /// Bytes accepted and waiting for the next group commit, per owner.
    private(set) var pending: [StreamOwner: Int] = [:]
    /// Streams registered to each owner.
    private(set) var streams: [StreamOwner: Int] = [:]

    func usage(_ o: StreamOwner) -> (bytes: Int, streams: Int) { (bytes[o, default: 0] + pending[o, default: 0], streams[o, default: 0]) }

    /// nil when `owner` may queue `n` more bytes (on a new stream if `newStream`); otherwise the
    /// -32004 error naming the limit. `totalBytes` is what every owner holds (the shared cap).
    func admit(_ owner: StreamOwner, bytes n: Int, newStream: Bool, totalBytes: Int, limits: UploaderLimits) -> RPCError? {
        if newStream, streams[owner, default: 0] >= limits.streams(for: owner) {
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
        if usage(owner).bytes + n > quota {
            return RPCError(
                .overloaded, "\(owner) has \(usage(owner).bytes) of its \(quota) bytes queued (maxDiskBytesPerOwner); records refused",
                data: ["limit": "maxDiskBytesPerOwner", "value": .int(Int64(quota)), "owner": .string(owner.description)])
        }
        return nil
    }

    mutating func addStream(_ o: StreamOwner) { streams[o, default: 0] += 1 }
    mutating func reserve(_ o: StreamOwner, _ n: Int) { pending[o, default: 0] += n }
    /// A group commit finished: `reserved` bytes were waiting, `stored` of them were new rows.
    mutating func committed(_ o: StreamOwner, reserved: Int, stored: Int) {
        pending[o] = max(0, pending[o, default: 0] - reserved)
        bytes[o, default: 0] += stored
    }
    mutating func add(_ o: StreamOwner, _ n: Int) { bytes[o, default: 0] += n }
    mutating func remove(_ o: StreamOwner, _ n: Int) { bytes[o] = max(0, bytes[o, default: 0] - n) }
}

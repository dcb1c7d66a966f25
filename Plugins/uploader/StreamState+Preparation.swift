/// A batch read from disk and compressed: ready to post.
struct LoadedBatch: Equatable {
    var gz: [UInt8]
    var count: Int
    /// Bytes of its record bodies (their share of the disk cap).
    var recordBytes: Int
}

/// The batches a stream reads and compresses off the loop (`Uploader.load`): the one prepared
/// ahead while the one before it is in flight (`Step.prepare`), and the one being sent while it
/// still compresses. Each is compressing (and, once its `send` came first, to be posted to
/// `postTo` when done) or ready; at most `maxBatchBytes` of records before compression each.
/// The shell starts the reads and posts what these answers say; it keeps no table of its own.
extension StreamState {
    enum Preparation: Equatable {
        case compressing(postTo: String?)
        case ready(LoadedBatch)
    }

    /// What a `send` of a batch does.
    enum SendStart: Equatable {
        /// Prepared ahead and still compressing: posted when it is done.
        case waitForCompression
        /// Prepared ahead and ready: post it now.
        case upload(LoadedBatch)
        /// Not prepared: read and compress it now, then post it (`preparationFinished`).
        case load
    }

    /// What to do when the read and compression of a batch finished.
    enum PreparationEnd: Equatable {
        /// Dissolved meanwhile (a 413), or never asked for: nothing.
        case nothing
        /// Prepared ahead of its `send`: kept for it (a failure is not kept: the `send` reads
        /// again).
        case kept
        /// Its `send` came first: post it to `endpoint`.
        case upload(LoadedBatch, endpoint: String)
        /// Its `send` came first and it could not be read or compressed: the stream backs off
        /// (`storeFailed`).
        case failed
    }

    /// Batch `key` is to be read and compressed ahead of its send (`Step.prepare`).
    mutating func startPreparing(_ key: String) { prepared[key] = .compressing(postTo: nil) }

    /// Batch `key` is to be sent to `endpoint`.
    mutating func startSend(_ key: String, to endpoint: String) -> SendStart {
        switch prepared[key] {
        case .compressing:
            prepared[key] = .compressing(postTo: endpoint)
            return .waitForCompression
        case .ready(let loaded):
            prepared[key] = nil
            return .upload(loaded)
        case nil:
            prepared[key] = .compressing(postTo: endpoint)
            return .load
        }
    }

    /// The read and compression of batch `key` finished with `loaded` (nil: it failed).
    mutating func preparationFinished(_ key: String, _ loaded: LoadedBatch?) -> PreparationEnd {
        guard case .compressing(let postTo) = prepared[key] else { return .nothing }
        guard let postTo else {
            prepared[key] = loaded.map { .ready($0) }
            return .kept
        }
        prepared[key] = nil
        guard let loaded else { return .failed }
        return .upload(loaded, endpoint: postTo)
    }

    /// Batch `key` was dissolved: what was prepared of it goes.
    mutating func dropPreparation(_ key: String) { prepared[key] = nil }
}

#if canImport(Glibc)
import Glibc
#endif

/// One request to a deferred raw method (`Plugin.deferredRawMethod`): the request's params and
/// caller as JSON text, copied out of the line (the line's buffer is reused), valid as long as
/// this object lives. Reply exactly once with `reply(serialized:)` or `fail`; later replies are
/// ignored, and a notification's replies are dropped.
///
/// One allocation per call: the id, params and caller bytes are stored after the object's header
/// (`ManagedBuffer`'s tail allocation), not in a buffer of their own. Use it through the members
/// below only; the buffer's own API is not part of the contract.
public final class RawCall: ManagedBuffer<RawCallHeader, UInt8> {
    /// Makes a call holding copies of `id`, `params` and `caller`.
    static func make(
        plugin: Plugin, id: UnsafeRawBufferPointer, params: UnsafeRawBufferPointer, caller: UnsafeRawBufferPointer?,
        isNotification: Bool = false
    ) -> RawCall {
        let c = caller?.count ?? 0
        let buffer = RawCall.create(minimumCapacity: id.count + params.count + c) { _ in
            RawCallHeader(
                plugin: plugin, isNotification: isNotification, idCount: id.count, paramsCount: params.count,
                callerCount: caller.map { $0.count } ?? -1)
        }
        let call = unsafeDowncast(buffer, to: RawCall.self)
        call.withUnsafeMutablePointerToElements { base in
            func put(_ bytes: UnsafeRawBufferPointer, at offset: Int) {
                if let b = bytes.baseAddress, bytes.count > 0 {
                    UnsafeMutableRawPointer(base + offset).copyMemory(from: b, byteCount: bytes.count)
                }
            }
            put(id, at: 0)
            put(params, at: id.count)
            if let caller { put(caller, at: id.count + params.count) }
        }
        return call
    }

    /// The stored bytes `offset..<offset+count` (valid while the call lives: the elements are
    /// part of this object and never move).
    @inline(__always) private func bytes(_ offset: Int, _ count: Int) -> UnsafeRawBufferPointer {
        withUnsafeMutablePointerToElements { UnsafeRawBufferPointer(start: $0 + offset, count: count) }
    }

    /// The params' JSON text (`null` when the request had none). Valid JSON: the line was
    /// validated strictly by the host (see `RawJSON.hostMessageSpans`), or parsed and
    /// re-serialised.
    public var params: UnsafeRawBufferPointer { bytes(header.idCount, header.paramsCount) }
    /// The host-written `_pylon` member's JSON text (see `Call.caller`), nil when absent.
    public var caller: UnsafeRawBufferPointer? {
        header.callerCount < 0 ? nil : bytes(header.idCount + header.paramsCount, header.callerCount)
    }
    private var id: UnsafeRawBufferPointer { bytes(0, header.idCount) }
    var plugin: Plugin { header.plugin }
    var isNotification: Bool { header.isNotification }

    /// The caller, read from the `_pylon` text (see `CallerInfo`; the plugin keeps the reading
    /// of the last text, which repeats for every request of one client).
    public var callerInfo: CallerInfo { plugin.callerInfo(text: caller) }

    /// Replies with a result that is already serialized JSON text (built by the plugin, so
    /// trusted).
    public func reply(serialized result: [UInt8]) { result.withUnsafeBytes { reply(text: $0) } }

    /// Replies with a Swift value (serialised as `Call.reply` does): for answers off the hot path.
    public func reply(_ result: JSON) { JSONRef(result).withSerialized { reply(text: $0) } }

    private func reply(text: UnsafeRawBufferPointer) {
        guard !header.answered, !header.isNotification else { header.answered = true; return }
        header.answered = true
        plugin.sendResult(id: id, text)
    }

    public func fail(_ e: RPCError) {
        guard !header.answered, !header.isNotification else { header.answered = true; return }
        header.answered = true
        plugin.channel?.send(envelope: Envelope.error(id: .text(id), e))
    }
}

/// A `RawCall`'s fixed part (its bytes follow it in the same allocation). Public only because
/// `RawCall`'s superclass names it; nothing in it is.
public struct RawCallHeader {
    unowned let plugin: Plugin
    var answered = false
    let isNotification: Bool
    let idCount: Int
    let paramsCount: Int
    /// -1: no caller text.
    let callerCount: Int

    init(plugin: Plugin, isNotification: Bool, idCount: Int, paramsCount: Int, callerCount: Int) {
        self.plugin = plugin
        self.isNotification = isNotification
        self.idCount = idCount
        self.paramsCount = paramsCount
        self.callerCount = callerCount
    }
}

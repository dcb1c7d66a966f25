import CZlib
import FuzzSupport
import PylonCore
import pylon_uploader

#if canImport(Glibc)
import Glibc
#endif

/// Fuzz target (segment): the uploader's queue replayed from a damaged or hostile segment file.
/// Each input becomes `uploader.queue/0000000001.seg` of a fresh state directory, which
/// `UploaderStore` opens as the uploader does at start (frames, packed contexts and their
/// inflate streams, the batch ledger, torn tails), then every pending batch's body is read.
///
/// The first byte picks the form: even, the rest is the file after its magic, as it lies on disk
/// (crc failures, torn tails, frames that do not fit); odd, the rest is frame bodies, each led
/// by a length byte, which the target seals with their length and crc, so that the decoders
/// behind the crc check (lanes, records, packed frames, cuts, ended frames) see every shape.
/// Seeds: `Fuzz/corpus/segment` (tools/fuzz-segment-seeds.py writes them).
///
/// Properties: nothing traps, and after the replay the segments' accounting is consistent
/// (`segmentUseErrors` finds nothing).
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOne(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    guard let data, size > 0 else { return 0 }
    let input = UnsafeRawBufferPointer(start: data, count: size)
    var file = Array("PYLQSEG1".utf8)
    if input[0] & 1 == 0 {
        file += input.dropFirst()
    } else {
        var i = 1
        while i < input.count {
            let n = Int(input[i])
            i += 1
            let body = Array(input[i..<min(input.count, i + n)])
            i += n
            var crc: UInt32 = 0
            body.withUnsafeBufferPointer { crc = UInt32(truncatingIfNeeded: crc32(0, $0.baseAddress, uInt($0.count))) }
            for v in [UInt32(body.count), crc] { for k in 0..<4 { file.append(UInt8(truncatingIfNeeded: v >> (8 * k))) } }
            file += body
        }
    }
    var template = Array("/tmp/pylon-fuzz-segment.XXXXXX".utf8CString)
    guard let made = mkdtemp(&template) else { return 0 }
    let dir = String(cString: made)
    defer { removeTree(dir) }
    let queue = dir + "/uploader.queue"
    guard mkdir(queue, 0o700) == 0 else { return 0 }
    let fd = open(queue + "/0000000001.seg", O_WRONLY | O_CREAT | O_TRUNC, 0o600)
    guard fd >= 0 else { return 0 }
    _ = file.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
    close(fd)
    if let problems = fuzzReplayQueue(path: dir + "/uploader.db") {
        fuzzCheck(problems.isEmpty, "segment accounting after replay: \(problems)")
    }
    return 0
}

/// Removes the state directory of one input (a queue directory, its files and the database).
func removeTree(_ path: String) {
    if let d = opendir(path) {
        while let e = readdir(d) {
            let name = withUnsafeBytes(of: e.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
            if name == "." || name == ".." { continue }
            let child = path + "/" + name
            if unlink(child) != 0 { removeTree(child) }
        }
        closedir(d)
    }
    rmdir(path)
}

@main struct Main {
    static func main() { FuzzMain.run(fuzzOne) }
}

import PylonCore
import Testing

struct SipHash128Tests {
    /// The reference implementation's `vectors_sip128` (SipHash-2-4, key 00 01 .. 0f, message
    /// 00 01 .. len-1): the first four, and 15 bytes (a whole word and
    /// a partial one).
    @Test(arguments: [
        (0, "a3817f04ba25a8e66df67214c7550293"),
        (1, "da87c1d86b99af44347659119b22fc45"),
        (2, "8177228da4a45dc7fca38bdef60affe4"),
        (3, "9c70b60c5267a94e5f33b6b02985ed51"),
        (15, "5493e99933b0a8117e08ec0f97cfc3d9"),
    ])
    func referenceVectors(length: Int, hex: String) {
        let key = (UInt64(0x0706_0504_0302_0100), UInt64(0x0f0e_0d0c_0b0a_0908))
        let message = (0..<length).map { UInt8($0) }
        let (a, b) = message.withUnsafeBytes { SipHash128.hash($0, key: key, compressionRounds: 2, finalizationRounds: 4) }
        var out = ""
        for half in [a, b] {
            for i in 0..<8 {
                let byte = UInt8(truncatingIfNeeded: half >> (8 * UInt64(i)))
                out += String(byte, radix: 16).count == 1 ? "0" + String(byte, radix: 16) : String(byte, radix: 16)
            }
        }
        #expect(out == hex)
    }

    @Test func theKeyAndEveryByteMatter() {
        let m = Array("record-0001".utf8)
        let h = m.withUnsafeBytes { SipHash128.hash($0, key: (1, 2)) }
        #expect(m.withUnsafeBytes { SipHash128.hash($0, key: (1, 3)) } != h)
        var m2 = m
        m2[10] = UInt8(ascii: "2")
        #expect(m2.withUnsafeBytes { SipHash128.hash($0, key: (1, 2)) } != h)
        #expect(m.dropLast().withUnsafeBytes { SipHash128.hash($0, key: (1, 2)) } != h)
    }
}

// ---------------------------------------------------------------------------------------------
// attribute getters

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_attr_get_type(attr: *const NlAttr) -> u16 {
    unsafe { rd!(attr, nla_type) & NLA_TYPE_MASK }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_attr_get_len(attr: *const NlAttr) -> u16 {
    unsafe { rd!(attr, nla_len) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_attr_get_payload_len(attr: *const NlAttr) -> u16 {
    unsafe { rd!(attr, nla_len).wrapping_sub(MNL_ATTR_HDRLEN as u16) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_attr_get_payload(attr: *const NlAttr) -> *mut c_void {
    unsafe { attr.cast::<u8>().add(MNL_ATTR_HDRLEN) as *mut c_void }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_attr_get_u8(attr: *const NlAttr) -> u8 {
    unsafe { mnl_attr_get_payload(attr).cast::<u8>().read() }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_attr_get_u16(attr: *const NlAttr) -> u16 {
    unsafe { mnl_attr_get_payload(attr).cast::<u16>().read_unaligned() }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_attr_get_u32(attr: *const NlAttr) -> u32 {
    unsafe { mnl_attr_get_payload(attr).cast::<u32>().read_unaligned() }
}

/// The payload is only 4-byte aligned: read unaligned.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_attr_get_u64(attr: *const NlAttr) -> u64 {
    unsafe { mnl_attr_get_payload(attr).cast::<u64>().read_unaligned() }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn mnl_attr_get_str(attr: *const NlAttr) -> *const c_char {
    unsafe { mnl_attr_get_payload(attr).cast::<c_char>() }
}

# gpuk8s upgrade: `kubeadm upgrade plan VERSION`, `kubeadm upgrade apply VERSION -y` (the first control plane)
# or `kubeadm upgrade node` (every other node), one kubeadm of gpuk8s at a time on the host, run to its end
# even if gpuk8s goes away (gk_to_the_end).
gk_kubeadm_lock
case {{ action }} in
  plan) gk_to_the_end kubeadm-upgrade kubeadm upgrade plan {{ version }} ;;
  apply) gk_to_the_end kubeadm-upgrade kubeadm upgrade apply {{ version }} -y ;;
  node) gk_to_the_end kubeadm-upgrade kubeadm upgrade node ;;
esac
